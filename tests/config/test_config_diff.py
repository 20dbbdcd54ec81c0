"""One config diff for resume and ranks: changed, added and removed keys are named."""

from __future__ import annotations

from hookrun.config.differing import differing


def test_the_config_diff_names_changed_added_and_removed_keys():
    old = {"data": {"batch_size": 4, "limit": None}, "seed": 0, "hooks": {"a": {"at": "fc"}}, "params": {}}
    new = {"data": {"batch_size": 8}, "seed": 0, "hooks": {"a": {"at": "fc"}, "b": {"at": "x"}}, "params": {"k": 1}}
    assert differing(old, new) == ["data.batch_size", "data.limit", "hooks.b.at", "params", "params.k"]
    assert differing(old, new, ignore={"data"}) == ["hooks.b.at", "params", "params.k"]
    assert differing(old, old) == []
