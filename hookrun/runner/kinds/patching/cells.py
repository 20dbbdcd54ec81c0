"""Cells and grids: where each cell of a patching grid is, and how cells are numbered.

    grid = SiteGrid("heads", ("blocks.0.attn.hook_z", "blocks.1.attn.hook_z"), ("position", "head"),
                    ("sample", "position", "head", "feature"), (12, 4), offset=0)
    grid.shape            # (2, 12, 4): module, then the over axes
    grid.cell(5)          # Cell(site='heads', module='blocks.0.attn.hook_z', index=(1, 1))
    grid.tensor_index(grid.cell(5))   # (1, 1, slice(None)): the axes after the sample axis

A cell is one module of a site and one index along each of the site's `over` axes; every other
axis of the tensor (the items' sample axis included) is patched whole. The cells of a run are
numbered site after site (in the block's order), module after module (in the model's order), then
along the over axes in C order: `Layout.cell(k)` is cell k, and a file's rows are these numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Cell:
    site: str
    module: str
    index: tuple[int, ...]  # one index per `over` axis


@dataclass(frozen=True)
class SiteGrid:
    name: str
    modules: tuple[str, ...]
    over: tuple[str, ...]
    dims: tuple[str, ...]  # the tensor's axes, sample first
    sizes: tuple[int, ...]  # the length of each over axis
    offset: int = 0  # the number of this site's first cell in the run

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.modules), *self.sizes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def cell(self, k: int) -> Cell:
        """The site's k-th cell (0 <= k < size)."""
        rest, index = k, []
        for n in reversed(self.sizes):
            rest, i = divmod(rest, n)
            index.append(i)
        return Cell(self.name, self.modules[rest], tuple(reversed(index)))

    def tensor_index(self, cell: Cell) -> tuple:
        """The index of the cell in the tensor, over the axes after the sample axis."""
        at = dict(zip(self.over, cell.index, strict=True))
        return tuple(at.get(d, slice(None)) for d in self.dims[1:])


class Layout:
    """Every site's grid, the cells numbered across them."""

    def __init__(self, grids: list[SiteGrid]) -> None:
        self.grids = grids
        self.size = sum(g.size for g in grids)

    def cell(self, k: int) -> Cell:
        for g in self.grids:
            if k < g.offset + g.size:
                return g.cell(k - g.offset)
        raise IndexError(k)

    def grid_of(self, k: int) -> SiteGrid:
        return next(g for g in self.grids if g.offset <= k < g.offset + g.size)

    def unchanged(self, k: int, source: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> bool:
        """Whether cell k's values (every item) are equal in the source and base runs' outputs."""
        grid = self.grid_of(k)
        cell = grid.cell(k - grid.offset)
        at = (slice(None), *grid.tensor_index(cell))
        return torch.equal(source[cell.module][at], base[cell.module][at])

    def describe(self) -> dict:
        """The layout as plain data (the file's attrs; the reader's reshape)."""
        return {g.name: {"modules": list(g.modules), "over": list(g.over), "sizes": list(g.sizes), "offset": g.offset,
                         "dims": list(g.dims)} for g in self.grids}
