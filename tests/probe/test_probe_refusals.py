"""The refusals issue 48 lists that had no test at their edges: split.test at 0 and 1 (outside
(0, 1)), and many ranks with no channel between them for probe and similarity (resume=true or not:
many ranks resume, tests/probe/test_probe_rank_resume.py): each one ConfigError line before any batch."""

from __future__ import annotations

import pytest

import hookrun
from hookrun.errors import ConfigError, HookrunError

DATA = {"dataset": {"_target_": "hookrun.data.shapes", "size": 16}, "batch_size": 8}
MODEL = {"_target_": "hookrun.models.tiny_cnn"}


@pytest.mark.parametrize("test", [0.0, 1.0, -0.25])
def test_split_test_outside_0_1_is_one_line(tmp_path, test) -> None:
    cfg = {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "probe": {"at": ["block1"], "target": "label", "split": {"test": test}}}
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg)
    assert f"probe.split.test={test}" in str(err.value) and "(0, 1)" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "p.h5").exists()


@pytest.mark.parametrize(("block", "message"), [
    ({"probe": {"at": ["block1"], "target": "label"}}, "probe over 2 ranks: no channel between the ranks"),
    ({"similarity": {"at": ["block1", "fc"]}}, "similarity over 2 ranks: no channel between the ranks"),
])
def test_many_ranks_without_a_channel_are_one_line(tmp_path, block, message) -> None:
    from hookrun.config.schema import load
    from hookrun.output.ranks import Ranks
    from hookrun.output.shards import ShardRun
    from hookrun.runner.prepare import prepare

    cfg = load({"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "resume": True,
                "output": {"path": str(tmp_path / "p.h5")}, **block})
    p = prepare(cfg)
    try:
        ShardRun(cfg, Ranks(rank=1, world=2)).adjust(p)  # (no rendezvous: no channel)
        with pytest.raises(ConfigError) as err:
            p.settings.kind.prepare_run(p)
        assert message in str(err.value) and "\n" not in str(err.value)
    finally:
        p.env.close()
        p.settings.kind.close()
