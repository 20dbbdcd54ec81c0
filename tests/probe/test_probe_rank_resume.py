"""A probe run over two ranks (torchrun) resumes from every state a kill leaves to the one-process
uninterrupted probes, and those equal scikit-learn's (test_probe_ranks.reference): rank 1 SIGKILLed
mid-pass; then, resumed, rank 1 finished and handed its rows over and rank 0 SIGKILLed before merging
them (rank 1's shard complete, its hand-over file on disk); then resumed again to the end."""

from __future__ import annotations

import numpy as np
import pytest
from rank_runs import TORCHRUN, cli, shard_state
from test_probe_ranks import ARGS, AT, B, N, reference

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
    one = hookrun.run({"model": {"_target_": "hookrun.models.tiny_cnn"}, "device": "cpu", "progress": False,
                       "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": N, "noise": 0.3}, "batch_size": B},
                       "output": {"path": str(tmp_path / "one.h5")},
                       "probe": {"at": AT, "target": "label", "method": "ridge", "alpha": 2.0, "control": True,
                                 "memory": "4MB"}}).path  # (the experiment's block, uninterrupted, in this process)
    r2, r1 = hookrun.open_run(run), hookrun.open_run(one)
    assert r2.status == "complete"
    assert r2.probes().rows == r1.probes().rows
    assert [row["rows"] for row in r2.probes().rows] == [N, N]
    for at in AT:
        w2, b2 = r2.probe_weights(at)
        w1, b1 = r1.probe_weights(at)
        np.testing.assert_array_equal(w2, w1)  # the same rows, recomputed, in the same blocks: bit for bit
        np.testing.assert_array_equal(b2, b1)
        weight, bias, test_acc = reference(at)
        np.testing.assert_allclose(w2, weight, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(b2, bias, rtol=1e-6, atol=1e-9)
        assert next(r for r in r2.probes().rows if r["at"] == at)["test"] == pytest.approx(test_acc)
