"""Table: records as named NumPy columns, one row per record."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np


def as_column(values: Sequence[Any]) -> np.ndarray:
    """A 1-D array; rows that are themselves lists (per-channel values) become an object array."""
    if any(isinstance(v, (list, tuple, np.ndarray)) for v in values):
        column = np.empty(len(values), dtype=object)
        column[:] = [np.asarray(v, dtype=float) for v in values]
        return column
    return np.asarray(values) if len(values) else np.array([], dtype=float)


class Table:
    """Rows of records held as named columns; `table["norm"]` is a NumPy array."""

    def __init__(self, columns: dict[str, Sequence[Any]]) -> None:
        self._columns = {name: as_column(values) for name, values in columns.items()}
        if len({len(c) for c in self._columns.values()}) > 1:
            raise ValueError("all columns of a Table need the same length")

    @classmethod
    def concat(cls, tables: Iterable[Table]) -> Table:
        """The rows of several tables with the same columns, one after the other."""
        tables = list(tables)
        filled = [t for t in tables if len(t)] or tables[:1]
        return cls({n: np.concatenate([t[n] for t in filled]) for n in tables[0].columns})

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return len(next(iter(self._columns.values()), ()))

    def __getitem__(self, column: str) -> np.ndarray:
        return self._columns[column]

    def rows(self) -> Iterator[tuple]:
        """Each row as a tuple of Python values, in column order."""
        return zip(*(c.tolist() for c in self._columns.values()))

    def where(self, **equal: Any) -> Table:
        """The rows whose columns equal the given values: `grads.where(rank=0, when="after")`."""
        keep = np.ones(len(self), dtype=bool)
        for name, value in equal.items():
            keep &= self._columns[name] == value
        return Table({n: c[keep] for n, c in self._columns.items()})

    def unique(self, column: str) -> list[Any]:
        """The distinct values of a column, sorted."""
        return np.unique(self._columns[column]).tolist()

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame (needs pandas, which the course does not install)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Table.to_pandas() needs pandas, which the course does not "
                              "install: run `pip install pandas`, or use the NumPy columns "
                              "directly: table['column'].") from None
        return pd.DataFrame({n: list(c) if c.dtype == object else c
                             for n, c in self._columns.items()})

    def __repr__(self) -> str:
        return f"Table({len(self)} rows; columns: {', '.join(self.columns)})"
