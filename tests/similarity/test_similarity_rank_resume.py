"""A similarity run over two ranks (torchrun, the Gram route: rank 1 hands over a folder of rows)
resumed after a kill equals the one-process uninterrupted matrix, and that equals linear CKA computed
by numpy on the features raw forward hooks record. The state: rank 1 finished and handed its rows over
and rank 0 SIGKILLed at its last batch, before merging them (rank 1's shard complete, its part on disk),
so rank 1 rebuilds its rows from its complete shard (rejoin). Rank 1 SIGKILLed mid-pass is the probe's
test (tests/probe/test_probe_rank_resume.py): the same resume of a shard, 34 s more here."""

from __future__ import annotations

import numpy as np
import pytest
from rank_runs import TORCHRUN, cli, shard_state
from test_similarity_engine import cka
from test_similarity_ranks import ARGS
from test_similarity_runs import cfg, file_matrix, grams, images, recorded

import hookrun

AT = ["block1", "block3", "fc"]
KILLS = ("hooks={kill: {at: block1, type: forward, actions: [{_target_: rank_helpers.kill_when_told, _partial_: true},"
         " {_target_: rank_helpers.kill_when_rank_1_is_done, _partial_: true}]}}")
RUN = [*ARGS, KILLS, "output.flush_every=1", "hydra.run.dir=run"]  # 40 items, 5 batches: rank 0 runs 0-1, rank 1 2-4


@pytest.mark.slow
def test_a_run_killed_after_rank_1_handed_over_resumes_to_the_one_process_matrix(tmp_path) -> None:
    from hookrun.models import tiny_cnn

    run = tmp_path / "run"
    env = {"HOOKRUN_TEST_KILL_AFTER": "0:1", "HOOKRUN_TEST_RUN_DIR": str(run)}  # rank 0, its last batch
    killed = cli(*RUN, cwd=tmp_path, launcher=TORCHRUN, env=env)
    said = killed.stdout[-2000:] + killed.stderr[-3000:]  # (what the ranks said, where an assertion below fails)
    assert killed.returncode != 0
    assert shard_state(run, 0)[0] != "complete", said
    assert shard_state(run, 1) == ("complete", [2, 3, 4]) and shard_state(run, 0)[1] == [0], said
    assert [p.is_dir() for p in run.glob(".hookrun-similarity-*.rank-00001")] == [True], said  # handed over, not merged

    resumed = cli(*RUN, "resume=true", cwd=tmp_path, launcher=TORCHRUN)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 1: similarity: the features of the 3 kept batch(es) recomputed" in resumed.stdout + resumed.stderr
    assert not list(run.glob(".hookrun-similarity-*"))
    got, meta = file_matrix(run / "captures.h5")
    assert meta["route"] == "gram" and hookrun.open_run(run).status == "complete"
    one = hookrun.run(cfg(tmp_path / "one.h5", n=40, batch=8, at=AT, pool="flatten")).path  # uninterrupted
    np.testing.assert_array_equal(got, file_matrix(one)[0])  # the rows recomputed, in batch order: bit for bit
    k = grams(recorded(tiny_cnn(), AT, images(40), "flatten"))
    np.testing.assert_allclose(got, [[cka(a, b) for b in k] for a in k], rtol=1e-6)
