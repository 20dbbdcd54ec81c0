"""Property-based: random, mostly invalid hook configs end in a complete run or a HookrunError
(one clear message, no traceback at the CLI), never in another exception or a file that claims
to be complete after an error."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import h5py
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hookrun
from hookrun.errors import HookrunError

TYPES = ["forward_pre", "forward", "backward_pre", "backward", "tensor", "param", "fwd", None, 1]
ATS = ["features.0", "features.*", "head", "", "pool", "nope", "features.9", "**", "[", "features.[02]",
       "head.weight", "*.bias", 3, None, ["head", "pool"], []]
OPS = ["zero", "scale", "add", "noise", "clamp", "mask", "mean", "constant", "patch", "zap"]
PARAMS = st.dictionaries(st.sampled_from(["factor", "value", "std", "min", "max", "index", "dim", "seed", "source", "arg", "junk"]),
                         st.one_of(st.integers(-3, 40), st.floats(-2, 2, allow_nan=False), st.sampled_from(["x", "0:2", None]),
                                   st.lists(st.integers(-2, 40), max_size=3)), max_size=3)
RECORD = st.fixed_dictionaries({"name": st.just("record")}, optional={
    "what": st.sampled_from(["input", "output", "grad", "grad_input", "output.1", "junk"]),
    "reduce": st.sampled_from(["mean", "max", "norm", "median"]),
    "dims": st.sampled_from(["spatial", "channel", "feature", 0, 1, 5, "depth"]),
    "select": st.sampled_from([{"dim": 1, "index": [0]}, {"dim": 1, "index": [999]}, {"dim": 1, "index": "0:2"}, {"dim": 1, "index": "x"}, [3]]),
    "dtype": st.sampled_from(["float16", "bfloat16", "int8"]),
    "every": st.sampled_from([1, 2, 0]), "limit": st.sampled_from([1, 3, 0, None]), "check_finite": st.booleans()})
MODIFY = st.builds(lambda name, op, params: {"name": name, "op": op, **params},
                   st.sampled_from(["modify_output", "replace_input", "modify_grad", "bogus"]), st.sampled_from(OPS), PARAMS)
ACTION = st.one_of(st.just("record"), st.just("nope"), RECORD, MODIFY, st.just({"_target_": "nowhere.fn"}), st.just(7))
HOOK = st.fixed_dictionaries({"at": st.sampled_from(ATS), "type": st.sampled_from(TYPES)},
                             optional={"actions": st.lists(ACTION, max_size=3), "extra": st.just(1)})
CONFIG = st.fixed_dictionaries({
    "hooks": st.one_of(st.dictionaries(st.sampled_from(["a", "b", "c/d", ""]), HOOK, min_size=1, max_size=3), st.just([1])),
    "mode": st.sampled_from(["eval", "grad"]),
    "loss": st.sampled_from([None, {"_target_": "hookrun.runner.losses.sum_output", "_partial_": True},
                             {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}]),
}, optional={"early_stop": st.booleans(), "bogus_key": st.just(1), "data_limit": st.sampled_from([1, 0])})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIG)
def test_random_configs_end_cleanly(spec):
    folder = Path(tempfile.mkdtemp())
    try:
        cfg = {
            "model": {"_target_": "my_pkg.Net", "width": 4},
            "data": {"dataset": {"_target_": "my_pkg.MyData", "n": 4}, "batch_size": 2},
            "device": "cpu", "progress": False, "output": {"path": str(folder / "c.h5")},
            "hooks": spec["hooks"], "mode": spec["mode"], "loss": spec["loss"],
        }
        if "early_stop" in spec:
            cfg["early_stop"] = spec["early_stop"]
        if "bogus_key" in spec:
            cfg["bogus_key"] = 1
        if "data_limit" in spec:
            cfg["data"]["limit"] = spec["data_limit"]
        try:
            result = hookrun.run(cfg)
        except HookrunError as exc:
            assert str(exc) and "\n" not in str(exc).strip(), f"the message should be one line: {exc!r}"
            if (folder / "c.h5").exists():
                with h5py.File(folder / "c.h5") as f:
                    assert f.attrs["status"] != "complete"
        else:
            assert result.status == "complete"
            with h5py.File(result.path) as f:
                assert f.attrs["status"] == "complete"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
