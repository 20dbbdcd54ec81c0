"""A probe run SIGKILLed with its rows spilled past `memory` leaves its scratch folder beside its
file (hookrun/output/scratch.py); `resume=true` clears it, finishes, leaves nothing behind, and gives
the uninterrupted run's probes (and scikit-learn's: test_probe_ranks.reference)."""

from __future__ import annotations

import pytest
from rank_runs import cli
from test_probe_rank_resume import KILLS
from test_probe_ranks import ARGS, assert_same_probes, one_process

import hookrun


@pytest.mark.slow
def test_a_probe_killed_with_its_rows_spilled_resumes_and_leaves_nothing(tmp_path):
    run = [*(a for a in ARGS if not a.startswith("probe.memory=")), "probe.memory=10KB",  # the rows spill
           KILLS, "output.flush_every=1", "hydra.run.dir=run"]
    killed = cli(*run, cwd=tmp_path, env={"HOOKRUN_TEST_KILL": "0:3"})  # SIGKILL at its 4th batch
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]  # SIGKILL
    left = list((tmp_path / "run").glob(".probe_rows.*"))
    assert [p.name for p in left] == [".probe_rows.captures.h5.rank-00000"] and list(left[0].iterdir())
    resumed = cli(*run, "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not list((tmp_path / "run").glob(".probe_rows*"))
    with hookrun.open_run(tmp_path / "run") as got, hookrun.open_run(one_process(tmp_path / "one.h5")) as want:
        assert got.status == "complete"
        assert_same_probes(got, want, exact=False)  # spilled blocks: the sums in another order (and scikit-learn's)
