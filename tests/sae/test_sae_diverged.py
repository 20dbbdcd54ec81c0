"""A training that diverges (a loss that is NaN or inf: an lr far too large) ends the run `failed` at that
step with one line (exit 1), and no SAE is written: it had gone on to the end, `complete`, and written an
SAE of NaN weights (which op: splice then refused). Reference: SAELens' own SAETrainer on the same rows,
seed and lr: the step its loss is first non-finite, and its figures of the steps before."""

from __future__ import annotations

import math

import h5py
import pytest
import torch
from test_sae_train import CAPTURE, D_IN, D_SAE, make_cache

import hookrun
from hookrun.errors import RunError

sae_lens = pytest.importorskip("sae_lens")
from saelens_reference import saelens_fit  # noqa: E402

LR, ROWS, BATCH = 1e6, 640, 32


def saelens_reference(tmp_path, lr: float):
    """The cache, and SAELens' own SAETrainer on its rows at this lr (seed 5): the trained SAE and its logs."""
    torch.set_num_threads(1)
    cache = make_cache(tmp_path)
    with h5py.File(cache) as f:
        x = torch.from_numpy(f[f"captures/{CAPTURE}"][:])
    torch.manual_seed(5)
    ref = sae_lens.StandardTrainingSAE(sae_lens.StandardTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, l1_coefficient=2.0))
    return cache, ref, saelens_fit(ref, x, ROWS, BATCH, lr=lr, lr_end=lr / 10)


def sae_run(tmp_path, cache, lr: float, out, **output) -> dict:
    """hookrun's run of the same training: the same rows, seed and lr, the SAE written to `out`."""
    return {"model": {"_target_": "torchvision.ops.MLP", "in_channels": 8, "hidden_channels": [16]},
            "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 4, "shape": [8], "num_classes": 2,
                                 "seed": 3}, "batch_size": 4},
            "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "run" / "captures.h5"), **output},
            "sae": {"from": cache, "capture": CAPTURE, "architecture": "standard", "l1_coefficient": 2.0, "d_sae": D_SAE,
                    "lr": lr, "batch_rows": BATCH, "rows": ROWS, "shuffle": False, "seed": 5, "out": str(out)}}


def test_a_diverged_training_fails_at_its_first_nan_step_and_writes_no_sae(tmp_path):
    cache, ref, logs = saelens_reference(tmp_path, LR)
    bad = next(i for i, log in enumerate(logs) if not math.isfinite(log["losses/overall_loss"]))
    assert 0 < bad < len(logs) - 1  # (SAELens trains on to the end: its weights are NaN)
    assert not all(torch.isfinite(p).all() for p in ref.parameters())

    out = tmp_path / "sae"
    cfg = sae_run(tmp_path, cache, LR, out, flush_every=1)
    with pytest.raises(RunError) as info:
        hookrun.run(cfg)
    assert str(info.value) == (
        f"sae: the training diverged at step {bad}: its loss is {logs[bad]['losses/overall_loss']:g} (lr {LR:g}), "
        "so the SAE's weights are no longer finite; no SAE is written: give a smaller sae.lr (or sae.normalize: "
        "expected_norm, for rows of a large norm)")
    assert not out.exists()
    with hookrun.open_run(tmp_path / "run") as run:
        assert run.status == "failed"
        t = run.sae_curves()
        assert t.column("step") == list(range(bad + 1))  # the steps up to the one that diverged, as SAELens logged them
        for row, want in zip(t.rows, logs, strict=False):
            assert row["overall_loss"] == pytest.approx(want["losses/overall_loss"], rel=1e-6, nan_ok=True)


def test_a_loss_a_million_times_the_first_steps_fails_though_finite(tmp_path):
    """lr=1000: SAELens' loss rises from about 2e2 to about 1e26 and stays finite, so the run went on to the end,
    `complete`, and wrote an SAE whose explained variance is about -1e24. Reference: SAELens' SAETrainer on the
    same rows, seed and lr: its first step whose loss passes 1e6 times its first step's."""
    lr = 1e3
    cache, ref, logs = saelens_reference(tmp_path, lr)
    losses = [log["losses/overall_loss"] for log in logs]
    assert all(math.isfinite(v) for v in losses) and all(torch.isfinite(p).all() for p in ref.parameters())
    assert logs[-1]["metrics/explained_variance"] < -1e6  # (the SAE SAELens ends with reconstructs nothing)
    bad = next(i for i, v in enumerate(losses) if v > 1e6 * losses[0])
    out = tmp_path / "sae"
    cfg = sae_run(tmp_path, cache, lr, out)
    with pytest.raises(RunError) as info:
        hookrun.run(cfg)
    assert str(info.value) == (
        f"sae: the training diverged at step {bad}: its loss is {losses[bad]:g} (lr {lr:g}), more than 1e+06 times its "
        f"first step's {losses[0]:g}, so the SAE reconstructs nothing; no SAE is written: give a smaller sae.lr (or "
        "sae.normalize: expected_norm, for rows of a large norm)")
    assert not out.exists()
    with hookrun.open_run(tmp_path / "run") as run:
        assert run.status == "failed"
