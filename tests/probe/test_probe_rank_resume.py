"""A probe run over two ranks (torchrun) resumes from every state a kill leaves to the one-process
uninterrupted probes, and those equal scikit-learn's (test_probe_ranks.reference): rank 1 SIGKILLed
mid-pass; then, resumed, rank 1 finished and handed its rows over and rank 0 SIGKILLed before merging
them (rank 1's shard complete, its hand-over file on disk); then resumed again to the end."""

from __future__ import annotations

import pytest
from rank_runs import TORCHRUN, cli, shard_state
from test_probe_ranks import ARGS, assert_same_probes, one_process

import hookrun

KILLS = ("hooks={kill: {at: block1, type: forward, actions: [{_target_: rank_helpers.kill_when_told, _partial_: true},"
         " {_target_: rank_helpers.kill_when_rank_1_is_done, _partial_: true}]}}")
RUN = [*ARGS, KILLS, "output.flush_every=1", "hydra.run.dir=run"]  # 5 batches: rank 0 runs 0-1, rank 1 runs 2-4


@pytest.mark.slow
def test_a_killed_rank_then_a_killed_rank_0_resume_to_the_one_process_probes(tmp_path):
    run = tmp_path / "run"
    killed = cli(*RUN, cwd=tmp_path, launcher=TORCHRUN, env={"HOOKRUN_TEST_KILL": "1:3"})  # rank 1, its 2nd batch
    assert killed.returncode != 0
    assert shard_state(run, 1)[1] == [2]  # rank 1 kept its first batch
    assert shard_state(run, 0)[0] != "complete"

    env = {"HOOKRUN_TEST_KILL_AFTER": "0:1", "HOOKRUN_TEST_RUN_DIR": str(run)}  # rank 0, its last batch
    killed = cli(*RUN, "resume=true", cwd=tmp_path, launcher=TORCHRUN, env=env)
    assert killed.returncode != 0
    assert shard_state(run, 1) == ("complete", [2, 3, 4])
    assert shard_state(run, 0)[0] != "complete" and shard_state(run, 0)[1] == [0]
    assert len(list(run.glob(".hookrun-probe-*.rank-00001"))) == 1  # handed over, never merged

    resumed = cli(*RUN, "resume=true", cwd=tmp_path, launcher=TORCHRUN)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 1: probe: the rows of the 3 kept batch(es) recomputed" in resumed.stdout + resumed.stderr
    assert not list(run.glob(".hookrun-probe-*"))  # rank 1's rows file, merged and removed by rank 0
    r2 = hookrun.open_run(run)
    assert r2.status == "complete"
    assert_same_probes(r2, hookrun.open_run(one_process(tmp_path / "one.h5")))  # bit for bit, and scikit-learn's
