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


@pytest.mark.slow
def test_a_resumed_probe_recomputes_its_kept_rows_through_the_users_interventions(tmp_path):
    """`hooks:` that change outputs (block1 negated, block2 scaled) change the probed features; a resumed
    run recomputed its kept batches' rows without them, so its probe was fitted to a mix of two
    forwards. Reference: scikit-learn's Ridge on raw-hook features made with the same changes."""
    import numpy as np
    import torch
    from kill_in_flush import killed_inside_a_flush
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from hookrun.data import shapes
    from hookrun.models import tiny_cnn

    hooks = {"neg": {"at": "block1", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": -1.0}]},
             "abl": {"at": "block2", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.1}]}}

    def config(name):
        return {"model": {"_target_": "hookrun.models.tiny_cnn"}, "seed": 0, "device": "cpu", "progress": False,
                "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 40}, "batch_size": 5},
                "output": {"path": str(tmp_path / name), "flush_every": 1}, "hooks": hooks,
                "probe": {"at": ["block3"], "target": "label", "method": "ridge", "alpha": 1.0}}

    assert killed_inside_a_flush(config("k.h5"), 4).returncode == 9
    assert hookrun.run({**config("k.h5"), "resume": True}).status == "complete"
    torch.manual_seed(0)
    model = tiny_cnn().eval()
    model.block1.register_forward_hook(lambda m, i, o: o * -1.0)
    model.block2.register_forward_hook(lambda m, i, o: o * 0.1)
    kept = []
    model.block3.register_forward_hook(lambda m, i, o: kept.append(o.double().mean((2, 3))))
    items = list(shapes(40))
    with torch.no_grad():
        model(torch.stack([x for x, _ in items]))
    x, y = kept[0].numpy(), np.array([int(t) for _, t in items])
    train, test = train_test_split(np.arange(40), test_size=0.25, random_state=0)
    onehot = np.eye(int(y.max()) + 1)[y]
    ref = make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(x[train], onehot[train])
    with hookrun.open_run(tmp_path / "k.h5") as run:
        weight, bias = run.probe_weights("block3")
    np.testing.assert_allclose(x[test] @ weight.T + bias, ref.predict(x[test]), rtol=1e-6, atol=1e-8)
