"""A damaged source file (issue 34 item 9): an object header overwritten as a bad disk block would,
in a patch source, an `evaluate.mean` file or a file to resume, is one line naming the file and what
cannot be read, before any batch; never a traceback (it was `KeyError: Unable to synchronously open
object (bad object header version number)` for the /captures group of a patch source)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import make_cfg
from lm_runs import lm_cfg, scaled_block

import hookrun
from hookrun.errors import ConfigError

RECORD = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
PATCH = {"p": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "patch", "source": None}]}}


def _damage_header(path, name):
    """Overwrite the first bytes of an object's header (its version byte first) with 0xff."""
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[name].id).addr
    with open(path, "r+b") as raw:
        raw.seek(addr)
        raw.write(b"\xff" * 16)
    with h5py.File(path, "r") as f, pytest.raises(KeyError, match="bad object header"):
        f[name]  # plain h5py cannot open it: the damage is real


@pytest.fixture(scope="module")
def clean(tmp_path_factory, checkpoint):
    folder = tmp_path_factory.mktemp("clean")
    return hookrun.run(make_cfg(folder, checkpoint, RECORD)).path


def _patched(tmp_path, checkpoint, source):
    hooks = {"p": {**PATCH["p"], "actions": [{**PATCH["p"]["actions"][0], "source": str(source)}]}}
    return make_cfg(tmp_path, checkpoint, hooks)


@pytest.mark.parametrize("damaged, named", [
    ("captures", r"the group /captures cannot be read"),
    ("samples/index", r"the sample index of /captures/l/layer2/output \(/samples/index\) cannot be read"),
])
def test_a_damaged_patch_source_is_one_line_naming_the_file_and_what(tmp_path, checkpoint, clean, damaged, named):
    source = tmp_path / "source.h5"
    source.write_bytes(clean.read_bytes())
    _damage_header(source, damaged)
    with pytest.raises(ConfigError, match=rf"patch source '{source}'.*{named}.*bad object header version number") as info:
        hookrun.run(_patched(tmp_path, checkpoint, source))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "captures.h5").exists()  # before any batch


def test_a_damaged_evaluate_mean_file_is_one_line(tmp_path):
    record = {"r": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    source = hookrun.run(lm_cfg(tmp_path, record, None, "source.h5")).path
    _damage_header(source, "captures/r/transformer.h.0/output")
    with pytest.raises(ConfigError, match=rf"evaluate.mean: '{source}': the capture /captures/r/transformer.h.0/output "
                                          r"cannot be read: the file is damaged \(bad object header") as info:
        hookrun.run(lm_cfg(tmp_path, scaled_block(0.5), {"ablation": "mean", "mean": str(source)}))
    assert "\n" not in str(info.value) and not (tmp_path / "run.h5").exists()


def test_a_damaged_file_to_resume_is_one_line_and_left_as_it_was(tmp_path, checkpoint):
    cfg = make_cfg(tmp_path, checkpoint, RECORD)
    path = hookrun.run(cfg).path
    with h5py.File(path, "a") as f:
        f.attrs["status"] = "interrupted"
        assert np.isfinite(f["captures/l/layer2/output"][:]).all()
    _damage_header(path, "captures/l/layer2/output")
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=rf"resume: '{path}': the capture /captures/l/layer2/output cannot be read: "
                                          r"the file is damaged \(bad object header") as info:
        hookrun.run({**cfg, "resume": True})
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before


def _overwrite(path, start, n):
    with open(path, "r+b") as raw:
        raw.seek(start)
        raw.write(b"\xff" * n)


def test_a_patch_source_damaged_right_after_its_superblock_is_one_line_naming_it(tmp_path, checkpoint, clean):
    """Issue 41 item 8: the root group's own header (right after the superblock) overwritten: h5py
    opens the file, then fails at its first attribute read (it was `KeyError: ... bad object header
    version number` from store/reading.py)."""
    source = tmp_path / "source.h5"
    source.write_bytes(clean.read_bytes())
    with h5py.File(source, "r") as f:
        root = h5py.h5o.get_info(f.id).addr
    _overwrite(source, root, 4096)
    with pytest.raises(ConfigError, match=rf"patch source '{source}'.*'{source}' is damaged: bad object header") as info:
        hookrun.run(_patched(tmp_path, checkpoint, source))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "captures.h5").exists()


def test_every_h5py_error_opening_a_patch_source_past_its_superblock_is_one_line_naming_it(tmp_path, clean):
    """16 bytes overwritten at each of many offsets of the file's metadata (object headers, the root's
    local heap and B-tree): opening it as a patch source (its captures and their sample index read)
    either works or is one ConfigError naming the file; never h5py's KeyError / RuntimeError (the
    root's local heap overwritten was `RuntimeError: Unable to synchronously check link existence`)."""
    from hookrun.hooks.patch import PatchSource

    source = tmp_path / "source.h5"
    with h5py.File(clean, "r") as f:
        root = h5py.h5o.get_info(f.id).addr
    failed = 0
    for start in range(root, 2048, 37):
        source.write_bytes(clean.read_bytes())
        _overwrite(source, start, 16)
        try:
            PatchSource(str(source), None, "layer2", None, "output", "p", None).source.close()
        except ConfigError as exc:
            failed += 1
            assert f"patch source '{source}'" in str(exc), (start, str(exc))
            assert "\n" not in str(exc)
    assert failed  # the damage is real
