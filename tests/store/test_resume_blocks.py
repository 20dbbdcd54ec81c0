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
