"""evaluate under many processes is refused in one line, printed once (by rank 0), every rank exiting
non-zero: each rank would hold a part of the totals. The line was printed by every rank (two lines
under torchrun --nproc_per_node=2)."""

from __future__ import annotations

import pytest

import hookrun
from hookrun.config import load
from hookrun.errors import ConfigError
from hookrun.runner.kinds import check_config

LINE = "evaluate with many processes: each rank would hold a part of the totals; run it in one process"


def test_evaluate_under_two_ranks_is_refused_once_by_the_checks(monkeypatch):
    cfg = load(hookrun.compose("experiment=ablation_sweep", "device=cpu"))
    check_config(cfg)  # one process: accepted
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "t"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert str(info.value) == LINE and getattr(info.value, "every_rank", False)  # (the CLI: rank 0 prints it)


@pytest.mark.slow
def test_torchrun_evaluate_is_one_line_and_every_rank_fails(tmp_path):
    from rank_runs import TORCHRUN, cli

    # torchrun looks at its ranks every 10 s here, not every 0.1 s: at its default, a rank that exits
    # first (rank 1, which prints nothing) gets rank 0 stopped by SIGTERM (exitcode -15) before rank 0
    # has exited on its own, so whether both ranks' own exit codes show was a race on a loaded machine
    proc = cli("experiment=ablation_sweep", "hydra.run.dir=run", "device=cpu", "progress=false", cwd=tmp_path,
               launcher=[*TORCHRUN, "--monitor-interval=10"])
    assert proc.returncode != 0
    assert proc.stderr.count("hookrun: error:") == 1, proc.stderr[-3000:]
    assert f"hookrun: error: {LINE}\n" in proc.stderr
    assert proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-3000:]  # (torchrun's summary: both ranks)
    assert not list((tmp_path / "run").glob("captures*"))
