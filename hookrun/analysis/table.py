"""A table of plain values: rows of dicts that print aligned and convert to pandas.

    t = Table(["job", "ce_intervened"], [{"job": "0", "ce_intervened": 2.5}])
    print(t); t.to_pandas(); t.column("ce_intervened")

open_sweep(...).table() and the kinds' reader methods (open_run(...).edges(), ...) return one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Table:
    """Rows of plain values; prints aligned, converts to pandas."""

    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def column(self, name: str) -> list[Any]:
        return [r.get(name) for r in self.rows]

    def to_pandas(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns)

    def __str__(self) -> str:
        cells = [[_fmt(r.get(c)) for c in self.columns] for r in self.rows]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(self.columns)]
        line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([line(self.columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, str):
        return v.replace("\n", "\\n")
    return "" if v is None else str(v)
