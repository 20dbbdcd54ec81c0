"""The `sae:` kind as a run: its file's training curves and its SAE folder equal SAELens' SAETrainer
run directly (tests/sae/test_sae_train.py's reference), a run killed with SIGKILL and resumed ends equal
to it, and bad input is one line before any step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import ENV, HELPERS
from sae_kill_at_step import interrupt_at_step, resume_line
from test_sae_train import CAPTURE, make_cache, reference
from warm_python import python as warm

import hookrun
from hookrun.errors import ConfigError

sae_lens = pytest.importorskip("sae_lens")
from safetensors.torch import load_file  # noqa: E402

ROWS, BATCH = 640, 32


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return make_cache(tmp_path_factory.mktemp("sae_kind_cache"))


def config(cache: str, folder: Path, **sae) -> dict:
    block = {"from": cache, "capture": CAPTURE, "architecture": "topk", "k": 8, "d_sae": 64, "lr": 1e-3,
             "lr_schedule": {"warmup": 2, "decay": 0.2}, "batch_rows": BATCH, "rows": ROWS, "shuffle": False,
             "seed": 5, **sae}
    return {"model": {"_target_": "torchvision.ops.MLP", "in_channels": 8, "hidden_channels": [16]},
            "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": 4, "shape": [8], "num_classes": 2,
                                 "seed": 3}, "batch_size": 4},
            "device": "cpu", "progress": False, "output": {"path": str(folder / "captures.h5")}, "sae": block}


def check_equals_reference(run_path: Path, out: Path, cache: str) -> None:
    ref, logs = reference(cache, "topk", ROWS, seed=5, lr_warmup=2, lr_decay_steps=4)
    with hookrun.open_run(run_path) as run:
        t = run.sae_curves()
        assert t.column("step") == list(range(20))
        for row, want in zip(t.rows, logs, strict=True):
            assert row["mse_loss"] == pytest.approx(want["losses/mse_loss"], rel=1e-6)
            assert row["overall_loss"] == pytest.approx(want["losses/overall_loss"], rel=1e-6)
            assert row["l0"] == pytest.approx(want["metrics/l0"], rel=1e-6)
            assert row["explained_variance"] == pytest.approx(want["metrics/explained_variance"], rel=1e-6, abs=1e-9)
            assert row["dead_features"] == want["sparsity/dead_features"]
            assert row["lr"] == pytest.approx(want["details/current_learning_rate"], rel=1e-6)
            assert row["samples"] == want["details/n_training_samples"]
    ref_dir = out.parent / "ref_inference"
    ref.save_inference_model(str(ref_dir))
    got, want = load_file(str(out / "sae_weights.safetensors")), load_file(str(ref_dir / "sae_weights.safetensors"))
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)
    assert json.loads((out / "cfg.json").read_text())["metadata"]["hook_name"] == "0"


def test_run_writes_saelens_curves_and_folder(cache, tmp_path):
    torch.set_num_threads(1)
    result = hookrun.run(config(cache, tmp_path / "run", checkpoints=2))
    assert result.status == "complete" and result.steps == 20
    check_equals_reference(result.path, tmp_path / "run" / "sae", cache)
    assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()) == [224, 448]
    with hookrun.open_run(result.path) as run:
        assert run.sae["epochs"] == 2 and run.sae["cache_rows"] == 400 and run.sae["d_in"] == 16


@pytest.mark.slow
def test_sigkill_then_resume_ends_equal(cache, tmp_path, caplog):
    cfg = config(cache, tmp_path / "run", checkpoints=3)
    cfg["output"]["flush_every"] = 1
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
    done = warm([str(HELPERS / "sae_kill_at_step.py"), "13", "config", json.dumps(cfg)], env=env, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    # checkpoints past 160, 320 and 480 samples: the kill came in step 13, after those at 192 and 352
    assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()) == [192, 352]
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        kept = f["samples/index"].shape[0]
    assert 0 < kept <= 14
    caplog.set_level("INFO", logger="hookrun")
    result = hookrun.run({**cfg, "resume": True})
    assert result.status == "complete"
    assert resume_line(tmp_path / "run" / "checkpoints", kept, BATCH) in caplog.text  # 11 (or 6 if the writer lagged)
    check_equals_reference(result.path, tmp_path / "run" / "sae", cache)


def test_a_resume_after_overwriting_an_earlier_run_never_takes_its_checkpoints(cache, tmp_path, monkeypatch,
                                                                              sigint_default, caplog):
    """Run A (another lr) left its checkpoints; run B overwrote A, stopped before a checkpoint of its own,
    and its resume took A's checkpoint: A's weights, optimizer and lr, in a file saying B's lr. Reference:
    SAELens' trainer run directly with B's settings (check_equals_reference). A's SAE stayed in sae.out
    while B trained (sae.overwrite), and a kill left it there as if it were B's."""

    from hookrun.output.process import Interrupted
    from hookrun.runner.kinds.sae import engine

    torch.set_num_threads(1)
    hookrun.run(config(cache, tmp_path / "run", checkpoints=3, lr=1e-2))
    assert len(list((tmp_path / "run" / "checkpoints").iterdir())) == 3
    cfg = config(cache, tmp_path / "run", checkpoints=0, overwrite=True)
    cfg["output"].update(overwrite=True, flush_every=1)
    step = interrupt_at_step(monkeypatch, 13)  # (Ctrl-C after step 13)
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    monkeypatch.setattr(engine.LoggingTrainer, "step", step)
    assert not (tmp_path / "run" / "sae" / "sae_weights.safetensors").exists()  # (A's SAE stayed, as if B's)
    caplog.set_level("INFO", logger="hookrun")
    result = hookrun.run({**cfg, "resume": True, "output": {**cfg["output"], "overwrite": False}})
    assert result.status == "complete" and "no checkpoint: from the start" in caplog.text
    check_equals_reference(result.path, tmp_path / "run" / "sae", cache)
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").iterdir())


def test_a_run_of_an_earlier_hookrun_resumes_with_its_figures_whole_and_silent_features_from_then(
        cache, tmp_path, monkeypatch):
    """A run written by a hookrun that logged no silent_features, interrupted, then resumed by this one: the
    file's curves equal SAELens' trainer run directly (every step), and silent_features is NaN at the steps
    the earlier run wrote, a value from the resume on (before: `run.sae_curves()` raised IndexError, that
    column shorter than the others by the steps the earlier run wrote)."""
    from hookrun.output.process import Interrupted
    from hookrun.runner.kinds.sae import engine

    torch.set_num_threads(1)
    cfg = config(cache, tmp_path / "run", checkpoints=3)
    cfg["output"]["flush_every"] = 1
    original = engine.LoggingTrainer.step

    def earlier(self, batch):  # noqa: ANN001, ANN202
        hook = self.on_step
        self.on_step = None if hook is None else (lambda step, figures: hook(step, {
            k: v for k, v in figures.items() if k != "sparsity/silent_features"}))
        try:
            return original(self, batch)
        finally:
            self.on_step = hook

    monkeypatch.setattr(engine.LoggingTrainer, "step", earlier)
    interrupted = interrupt_at_step(monkeypatch, 13)
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    monkeypatch.undo()
    assert interrupted is earlier
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        kept = f["samples/index"].shape[0]
        assert "silent_features" not in f["captures/sae/curves"] and 0 < kept < 20
    result = hookrun.run({**cfg, "resume": True})
    check_equals_reference(result.path, tmp_path / "run" / "sae", cache)
    with hookrun.open_run(result.path) as run:
        silent = run.sae_curves().column("silent_features")
    assert len(silent) == 20 and all(np.isnan(silent[:kept])) and not any(np.isnan(silent[kept:]))


def bad(cache: str, tmp_path: Path, **sae) -> str:
    with pytest.raises(ConfigError) as info:
        hookrun.run(config(cache, tmp_path / "bad", **sae))
    assert not (tmp_path / "bad" / "captures.h5").exists()  # nothing ran
    return str(info.value)


def test_bad_input_is_one_line_before_any_step(cache, tmp_path):
    assert "did you mean 'mlp/0/output'" in bad(cache, tmp_path, capture="mlp/0/outptu")
    assert "did you mean 'topk'" in bad(cache, tmp_path, architecture="topkk")
    assert "1 <= k <= d_sae" in bad(cache, tmp_path, k=100)
    for arch in ("topk", "batchtopk"):  # k left out: SAELens' default, 100, above d_sae 64 (was torch's topk traceback
        assert bad(cache, tmp_path, architecture=arch, k=None) == (  # at the first step, a failed file left behind)
            f"sae.k: not given, so SAELens' default for {arch}, k=100 latents kept per row, is more than d_sae 64; "
            f"give sae.k from 1 to 64")
    assert "the topk SAE keeps a whole number of latents per row, got 2.5" in bad(cache, tmp_path, k=2.5)  # (was torch's topk error)
    assert "sae.k: expected a number of latents kept per row, got 'abc'" in bad(cache, tmp_path, k="abc")
    assert "smaller than one batch" in bad(cache, tmp_path, rows=16)
    assert "has no such key" in bad(cache, tmp_path, architecture="standard", k=None, l0_coefficient=1.0)
    assert "matryoshka_widths" in bad(cache, tmp_path, architecture="matryoshka_batchtopk")
    assert "did you mean sae.architecture?" in bad(cache, tmp_path, architecure="topk")
    # (SAELens' tracebacks, some at the first step, each with a failed file left behind)
    d_sae = config(cache, tmp_path)["sae"]["d_sae"]
    for widths in ([-3, d_sae], [d_sae, d_sae]):
        assert "must rise strictly from at least 1" in bad(cache, tmp_path, architecture="matryoshka_batchtopk",
                                                         matryoshka_widths=widths)
    assert "needs at least 1 batch, got 0" in bad(cache, tmp_path, normalize="expected_norm", norm_batches=0)
    assert "choose step, tanh, quadratic" in bad(cache, tmp_path, architecture="jumprelu", k=None,
                                                 jumprelu_sparsity_loss_mode="foo")
    assert "give {buffer_rows: N, seed: S}, true or false" in bad(cache, tmp_path, shuffle=3)
    assert bad(cache, tmp_path, capture=None).startswith("sae: `from` has no `capture`; give")  # (said "not both")
    assert "drop it (sae.k=null, where the experiment sets one)" in bad(cache, tmp_path, architecture="standard")
    from hookrun.runner.kinds.sae.block import _shuffle

    assert _shuffle(True) == _shuffle(None) == {"buffer_rows": 1_000_000, "seed": 0}
    # a cache that is not complete
    partial = tmp_path / "partial.h5"
    partial.write_bytes(Path(cache).read_bytes())
    with h5py.File(partial, "a") as f:
        f.attrs["status"] = "running"
    assert "not complete" in bad(str(partial), tmp_path)
    # a cache not recorded yet (experiment=sae_train before sae_cache): where it looked and how to make one
    missing = tmp_path / "h3_cache" / "captures.h5"
    assert bad(str(missing), tmp_path) == (
        f"sae.from: no file {str(missing)!r} (relative to {os.getcwd()}); record the cache first (python -m hookrun "
        f"experiment=sae_cache hydra.run.dir=FOLDER, or any run that records the module) and give sae.from=FOLDER/captures.h5")
    # an out folder that holds another SAE
    other = tmp_path / "other"
    other.mkdir()
    (other / "cfg.json").write_text("{}")
    assert "already holds an SAE" in bad(cache, tmp_path, out=str(other))
    for msg in [bad(cache, tmp_path, capture="nope")]:
        assert "\n" not in msg


def test_shuffled_order_is_seeded_and_a_new_order_per_epoch(cache):
    from hookrun.runner.kinds.sae.data import CacheRows

    def rows(seed: int) -> np.ndarray:
        data = CacheRows(cache, CAPTURE, 32, {"buffer_rows": 128, "seed": seed})
        got = np.concatenate([next(data).numpy() for _ in range(25)])  # 800 rows: two passes over 400
        data.close()
        return got

    a, b, c = rows(0), rows(0), rows(1)
    with h5py.File(cache) as f:
        x = f[f"captures/{CAPTURE}"][:].astype(np.float32)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for half in (a[:400], a[400:]):  # each pass is a permutation of the cache's rows
        np.testing.assert_array_equal(np.sort(half, axis=0), np.sort(x, axis=0))
    assert not np.array_equal(a[:400], a[400:]) and not np.array_equal(a[:400], x)


@pytest.mark.slow
def test_cli_sweep_inspect_and_plot(cache, tmp_path):
    """`-m sae.k=4,8`: each job's SAE in its own run folder, one table in open_sweep (the last step's
    figures, read back here from each job's file with h5py), inspect's last step, plot's curves."""
    from conftest import run_cli

    common = [f"sae.from={cache}", f"sae.capture={CAPTURE}", "sae.d_sae=64", "sae.batch_rows=32", "sae.rows=320",
              "sae.out=null", "sae.checkpoints=0", "data.dataset.limit=1", "progress=false",
              "sae.lr_schedule.warmup=2"]
    done = run_cli("-m", "experiment=sae_train", "sae.k=4,8", *common, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    table = hookrun.open_sweep(tmp_path / "sweep").table(captures=[])
    assert [r["sae.k"] for r in table.rows] == [4, 8]
    for r in table.rows:
        job = tmp_path / "sweep" / str(r["job"])
        with h5py.File(job / "captures.h5") as f:
            assert r["l0"] == f["captures/sae/curves/l0"][-1] == r["sae.k"]
            assert r["explained_variance"] == f["captures/sae/curves/explained_variance"][-1]
        assert json.loads((job / "sae" / "cfg.json").read_text())["k"] == r["sae.k"]
    job0 = tmp_path / "sweep" / "0"
    out = warm(["-m", "hookrun.inspect", str(job0), "--no-stats"], cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    last = next(line for line in out.stdout.splitlines() if "last step" in line)
    with h5py.File(job0 / "captures.h5") as f:
        assert "last step 9: " in last and f"mse_loss {f['captures/sae/curves/mse_loss'][-1]:.6g}" in last
    plotted = warm(["-m", "hookrun.plot", str(job0)],
                   cwd=tmp_path, timeout=300)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert (job0 / "figures" / "sae_loss.png").stat().st_size > 0
    assert (job0 / "figures" / "sae_explained_variance.png").stat().st_size > 0
    from hookrun.analysis.kind_readers import kind_sweep_figures

    (stem, frontier), = kind_sweep_figures(hookrun.open_sweep(tmp_path / "sweep"))  # each job's last step
    last = []
    for j in (0, 1):
        with h5py.File(tmp_path / "sweep" / str(j) / "captures.h5") as f:
            last.append({k: f[f"captures/sae/curves/{k}"][-1] for k in ("l0", "explained_variance")})
    assert stem == "sae_sweep_l0_vs_explained_variance" and frontier.labels == ["sae.k=4", "sae.k=8"]
    assert frontier.x.tolist() == [c["l0"] for c in last] and frontier.y.tolist() == [c["explained_variance"] for c in last]
    from hookrun.cli.plot_command import plot_sweep

    assert f"{stem}.png" in {p.name for p in plot_sweep(hookrun.open_sweep(tmp_path / "sweep"), tmp_path / "fig")}


@pytest.mark.slow
def test_a_sweep_puts_each_jobs_sae_in_its_own_folder(cache, tmp_path):
    """experiment=sae_train's sae.out (saes/h3, with overwrite: true for re-running the loop) in a sweep
    typed as issue 49 writes it (no sae.out=null): each job writes its SAE under its own folder, never
    one folder that every job replaced in turn."""
    from conftest import run_cli

    common = [f"sae.from={cache}", f"sae.capture={CAPTURE}", "sae.d_sae=64", "sae.batch_rows=32", "sae.rows=320",
              "sae.checkpoints=0", "data.dataset.limit=1", "progress=false", "sae.lr_schedule.warmup=2"]
    done = run_cli("-m", "experiment=sae_train", "sae.k=4,8", *common, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "saes").exists()
    for job, k in ((0, 4), (1, 8)):
        assert json.loads((tmp_path / "sweep" / str(job) / "saes" / "h3" / "cfg.json").read_text())["k"] == k
