"""How the course writes numbers and ranks inside a sentence, in one place, so that every
message reads alike: "ranks 0, 2 and 3", "on 2 and 3 ranks", "its 3rd call". Imports nothing."""

from __future__ import annotations

from collections.abc import Iterable


def listing(items: Iterable[object]) -> str:
    """'2', '2 and 3', '2, 3 and 4': world sizes, ranks or names, in the order given."""
    words = [str(x) for x in items]
    return " and ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} and {words[-1]}"


def ranks(numbers: Iterable[int]) -> str:
    """'rank 1', 'ranks 0 and 2', 'ranks 0, 2 and 3': each rank once, in order."""
    ordered = sorted(set(numbers))
    return ("rank " if len(ordered) == 1 else "ranks ") + listing(ordered)


def nth(n: int) -> str:
    """1 -> '1st', 12 -> '12th', 23 -> '23rd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
