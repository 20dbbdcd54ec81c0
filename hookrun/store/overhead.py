"""HDF5's own bytes in a file besides its rows (object headers, chunk B-tree nodes, symbol tables,
attributes), by which the plan's estimate (runner/estimate.py) and each kind's estimate count the file
a run writes, so that `output.max_bytes` bounds it (store/__init__.py: the chunks the rows take).

    metadata_bytes([(4, 1, True)], groups=4)      # a file of one capture (rank 4, one chunk) in 4 groups
    table_bytes(1, 2, 3, text=40)                 # a group of 2 contiguous datasets and 3 attributes
"""

from __future__ import annotations

import math

from hookrun.store import INDEX_CHUNK, allocated, capped

# what HDF5 adds besides the chunks (fs_strategy none, the earliest file format; metadata_bytes): the
# superblock and root group, each group's symbol table and name heap, each dataset's object header
# (a capture's with its attributes). Measured on hookrun's files, rounded up.
FILE_BYTES, GROUP_BYTES, CAPTURE_HEADER, DATASET_HEADER = 2 << 10, 2 << 10, 1280, 384
ATTR_BYTES = 96  # an attribute's message in an object header, besides its value: its name, datatype, dataspace


def index_bytes(bound: int) -> int:
    """A `<name>.index` (int64) of at most `bound` rows, in its chunks."""
    return allocated(bound, capped(INDEX_CHUNK, bound)) * 8


def metadata_bytes(datasets: list[tuple[int, int, bool]], groups: int, attrs_bytes: int = 0) -> int:
    """HDF5's own bytes in a file of `groups` groups (the root too) and `datasets` given as (rank,
    chunks, a capture's: its attributes): object headers, chunk B-tree nodes (one per 64 chunks,
    half full after a split), symbol tables, the root's attributes (`attrs_bytes` of text)."""
    return FILE_BYTES + attrs_bytes + groups * GROUP_BYTES + dataset_bytes(datasets)


def dataset_bytes(datasets: list[tuple[int, int, bool]]) -> int:
    """The object headers and chunk B-tree nodes of `datasets` (see metadata_bytes)."""
    total = 0
    for rank, chunks, capture in datasets:
        node = 1576 + 520 * rank  # a v1 B-tree node of 64 chunk addresses and 65 keys of rank + 1 offsets
        total += (CAPTURE_HEADER if capture else DATASET_HEADER) + node * (1 if chunks <= 64 else math.ceil(chunks / 32) + 1)
    return total


def table_bytes(groups: int, datasets: int, attrs: int, text: int = 0) -> int:
    """HDF5's own bytes for `groups` groups, `datasets` contiguous datasets (an object header each, no chunk
    index), `attrs` attributes and `text` bytes of their values: what a kind writes whole (a probe's groups,
    evaluate's totals), and the file's root attributes (runner/run.plan_estimate)."""
    return groups * GROUP_BYTES + datasets * DATASET_HEADER + attrs * ATTR_BYTES + text
