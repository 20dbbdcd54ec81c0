"""The cache loader's `buffer_bytes` taken as every size key takes a size (docs/caches.md): '12KiB' is
12288 bytes, and a value that is no size is one ConfigError line. Before: '12KiB' ended in a TypeError
from inside the loader ("unsupported operand type(s) for //: 'str' and 'int"), and 0 or -5 ran on as
windows of one batch. Reference: h5py's rows of the file, and the loader's order with the bytes as an int."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from test_loader import write_cache

from hookrun import open_run
from hookrun.errors import ConfigError

CAP = "res/blocks.1/output"


def test_a_size_string_is_its_bytes(tmp_path) -> None:
    path = tmp_path / "cache.h5"
    write_cache(path, expected=None)
    with h5py.File(path, "r") as f:
        ref = f[f"captures/{CAP}"][:]
    with open_run(path) as run:
        got = [torch.cat(list(run.loader(CAP, batch_size=64, buffer_bytes=b, block_rows=37))).numpy()
               for b in ("12KiB", 12288, " 12 kib ")]
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[2], got[1])
    np.testing.assert_array_equal(np.sort(got[0], axis=0), np.sort(ref, axis=0))  # every row once


@pytest.mark.parametrize("bad", ["abc", 0, -5, "1e9"])
def test_a_buffer_that_is_no_size_is_one_line(tmp_path, bad) -> None:
    path = tmp_path / "cache.h5"
    write_cache(path, expected=None)
    with open_run(path) as run, pytest.raises(ConfigError) as e:
        run.loader(CAP, batch_size=64, buffer_bytes=bad)
    assert str(e.value) == f"loader: buffer_bytes={bad!r}; give bytes as a number or with a unit (512MB, 2GiB)"
