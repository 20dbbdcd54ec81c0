"""Resume compares configs by what they capture: a block's nulls and its `enabled: true` are the
defaults a later hookrun may write differently (the evaluate block from the command line stored
`enabled: null` before it became a plugin, and stores `enabled: true` now)."""

from __future__ import annotations

from hookrun.output.resume import config_differences

OLD = {"model": {"_target_": "m.Net"}, "evaluate": {"enabled": None, "ablation": "zero", "mean": None}, "patching": None}


def test_an_evaluate_block_written_with_enabled_null_resumes_under_enabled_true():
    new = {"model": {"_target_": "m.Net"}, "evaluate": {"enabled": True, "ablation": "zero"}}
    assert config_differences(OLD, new) == []


def test_what_an_evaluate_block_does_still_differs():
    assert config_differences(OLD, {"model": {"_target_": "m.Net"}, "evaluate": {"enabled": True, "ablation": "mean"}}) != []
    assert config_differences(OLD, {"model": {"_target_": "m.Net"}, "evaluate": {"enabled": False, "ablation": "zero"}}) != []


def test_a_block_the_resumed_config_lacks_is_named_once_with_its_keys(tmp_path):
    """A kind's whole block missing from the resumed config (a user's kind: `imports=[my_kinds]
    +scaled={factor: 2.5}` left off the second command) was said key by key, `in scaled.factor,
    scaled.label`, as if a value had changed. Now the block, as the file holds it (read with h5py and
    yaml), and the override that gives it back; a changed key is still said by its dotted name."""
    import h5py
    import pytest
    import yaml

    import hookrun
    from hookrun.errors import ConfigError

    base = {"model": {"_target_": "torchvision.ops.MLP", "in_channels": 8, "hidden_channels": [16, 4]},
            "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 8, "shape": [8]}, "batch_size": 4},
            "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "s.h5")}}
    path = hookrun.run({**base, "similarity": {"at": ["0", "2"], "pool": "mean"}}).path
    with h5py.File(path) as f:
        block = yaml.safe_load(f.attrs["config"])["similarity"]
    given = yaml.safe_dump({k: v for k, v in block.items() if v is not None}, default_flow_style=True, width=10**6).strip()
    with pytest.raises(ConfigError) as err:
        hookrun.run({**base, "resume": True})
    assert str(err.value) == (f"resume: the config differs from the one {str(path)!r} was written with, in similarity "
                              f"(only in the file's run: {given}; add '+similarity={given}'); resume with the same "
                              "settings (or start a new run)")
    with pytest.raises(ConfigError, match=r"written with, in similarity.pool; resume"):
        hookrun.run({**base, "similarity": {"at": ["0", "2"], "pool": "flatten"}, "resume": True})
