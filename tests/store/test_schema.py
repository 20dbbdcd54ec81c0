"""store/__init__.py's CaptureMeta and store/listing.py: a capture's metadata to attributes and back (read
with plain h5py as the reference), and the one resolver of capture names that Run.find and Captured.find share."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hookrun.errors import NotFoundError
from hookrun.store import CaptureMeta, RowKind
from hookrun.store.listing import CaptureInfo, list_captures, resolve, row_index


def test_metadata_round_trips_through_real_attributes(tmp_path):
    meta = CaptureMeta("fmap", "layer1.0", "forward", "output", 1, RowKind.TOKENS, "bfloat16", (4, 8),
                       index="output@1.index", ragged=True, extra={"reduce": "mean", "limit": 7})
    with h5py.File(tmp_path / "f.h5", "w") as f:
        ds = f.create_dataset("captures/fmap/layer1.0/output@1", data=np.zeros((3, 4, 8), np.float32))
        ds.attrs.update(meta.to_attrs())
        f.create_dataset("captures/fmap/layer1.0/output@1.index", data=np.array([5, 6, 9]))
    with h5py.File(tmp_path / "f.h5", "r") as f:
        a = f["captures/fmap/layer1.0/output@1"].attrs  # what any HDF5 reader sees
        assert (a["hook"], a["module"], a["type"], a["role"], int(a["call"])) == ("fmap", "layer1.0", "forward", "output", 1)
        assert a["rows"] == "tokens" and a["torch_dtype"] == "bfloat16" and list(a["row_shape"]) == [4, 8]
        assert bool(a["ragged"]) and a["index"] == "output@1.index" and a["reduce"] == "mean" and int(a["limit"]) == 7
        back = CaptureMeta.from_attrs(a)
        assert back == meta and back.rows is RowKind.TOKENS
        [info] = list_captures(f)
        assert (info.label, info.shape, info.rows) == ("fmap/layer1.0/output@1", (3, 4, 8), "tokens")
        np.testing.assert_array_equal(row_index(f, f[info.path]), [5, 6, 9])  # its own index wins


def _info(hook, module, role, call=0):
    return CaptureInfo(hook, module, role, call, "forward", (1,), "float32", "samples", f"captures/{hook}/{module}/{role}", 4)


def test_the_resolver_finds_by_module_role_hook_label_and_call():
    items = [_info("a", "layer1", "output"), _info("b", "layer1", "output"), _info("a", "", "input"),
             _info("a", "x/y", "output"), _info("a", "layer2", "output", call=1)]
    assert resolve(items, ("a", "layer1", "output")) is items[0]
    assert resolve(items, ("b/layer1/output",)) is items[1]
    assert resolve(items, ("(model)", "input")) is items[2]
    assert resolve(items, ("a/x/y/output",)) is items[3]  # a module name with a '/': by its label
    assert resolve(items, ("layer2", "output"), call=1) is items[4]
    with pytest.raises(NotFoundError, match=r"several hooks recorded 'layer1' 'output': give the hook too, one of a, b"):
        resolve(items, ("layer1", "output"))
    with pytest.raises(NotFoundError, match=r"run.h5 has no capture 'layer2/output'; closest: a/layer2/output@1"):
        resolve(items, ("layer2", "output"), source="run.h5")
    with pytest.raises(NotFoundError, match=r"named by \(module, role\) or \(hook, module, role\)"):
        resolve(items, ("a", "b", "c", "d"))
