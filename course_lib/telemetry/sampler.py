"""Record the dataset indices a rank consumes, by wrapping its sampler."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch.utils.data import Sampler

from course_lib.telemetry.host import RecordHost


class RecordedSampler(Sampler[int]):
    """Yields the wrapped sampler's indices and records them; each pass over it is one epoch.

    Wrap once, before the epoch loop: the epoch number is how many passes came before.
    """

    def __init__(self, sampler: Iterable[int], rec: RecordHost) -> None:
        self.sampler, self.rec, self.passes = sampler, rec, 0

    def __iter__(self) -> Iterator[int]:
        epoch, self.passes = self.passes, self.passes + 1
        for position, index in enumerate(self.sampler):
            self.rec.record_row("samples", epoch, position, int(index))
            yield index

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Pass set_epoch on to the wrapped sampler (DistributedSampler needs it)."""
        self.sampler.set_epoch(epoch)
