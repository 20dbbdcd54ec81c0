"""Only rank 0 draws a progress bar, and it counts its own batches. Reference: the ranks' stderr."""

from __future__ import annotations

from conftest import make_cfg


def test_only_rank_0_draws_a_bar_and_it_counts_its_own_batches(tmp_path, checkpoint):
    from hookrun.config import load
    from hookrun.output.process import Ranks
    from hookrun.output.shards import ShardRun
    from hookrun.runner.prepare import prepare

    cfg = load(make_cfg(tmp_path, checkpoint, None, progress=True))  # 12 samples in 3 batches of 4
    bars = {}
    for rank in (0, 1):
        p = prepare(cfg)
        ShardRun(cfg, Ranks(rank=rank, world=2)).adjust(p)
        bars[rank] = (p.settings.progress, p.settings.label, len(p.settings.batches))
        p.env.close()
    assert bars[0] == (True, "hookrun rank 0/2, batches 0-0", 1)
    assert bars[1][0] is False and bars[1][2] == 2
