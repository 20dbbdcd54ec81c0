"""The `sae:` kind on a vision model's feature maps (rows: channel): each position's channel
vector is a row (numpy's transpose of the stored maps is the reference), and the training equals
SAELens' SAETrainer run directly on those rows in that order."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

sae_lens = pytest.importorskip("sae_lens")
from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: E402
from saelens_reference import assert_same_latents, saelens_fit  # noqa: E402

from hookrun.runner.kinds.sae.data import CacheRows  # noqa: E402

CAPTURE = "fmap/block3/output"


def FROM_CACHE(cache: str) -> tuple[str, ...]:  # noqa: N802
    return ("sae.at=null", f"sae.from={cache}", f"sae.capture={CAPTURE}")


@pytest.fixture(scope="module")
def shapes_cache(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("shapes_cache")
    cfg = hookrun.compose("experiment=shapes_gradcam", "data.dataset.size=20", "data.batch_size=8", "progress=false",
                          f"hydra.run.dir={folder}")
    return str(hookrun.run(cfg).path)


def maps(cache: str) -> np.ndarray:
    with h5py.File(cache) as f:
        return f[f"captures/{CAPTURE}"][:].astype(np.float32)


def test_channel_vectors_are_each_positions_channels(shapes_cache):
    m = maps(shapes_cache)
    assert m.shape == (20, 32, 8, 8)
    want = m.transpose(0, 2, 3, 1).reshape(-1, 32)  # sample, then row-major positions
    data = CacheRows(shapes_cache, CAPTURE, 100, False, vectors="channel")
    assert (data.n_rows, data.d_in) == (1280, 32)
    got = np.concatenate([next(data).numpy() for _ in range(26)])  # 2600 rows: past the end, from the start
    data.close()
    np.testing.assert_array_equal(got[:1280], want)
    np.testing.assert_array_equal(got[1280:2560], want)
    shuffled = CacheRows(shapes_cache, CAPTURE, 100, {"buffer_rows": 640, "seed": 0}, vectors="channel")
    got = np.concatenate([next(shuffled).numpy() for _ in range(13)])[:1280]
    shuffled.close()
    assert not np.array_equal(got, want)
    np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(want, axis=0))  # every position once a pass


def test_channel_sae_run_equals_saelens(shapes_cache, tmp_path):
    torch.set_num_threads(1)
    cfg = hookrun.compose("experiment=sae_shapes", *FROM_CACHE(shapes_cache), "sae.budget=2560", "sae.batch_rows=128",
                          "sae.shuffle=false", "sae.d_sae=64", "sae.lr_schedule.warmup=2", "progress=false",
                          f"hydra.run.dir={tmp_path / 'run'}")
    result = hookrun.run(cfg)
    rows = torch.from_numpy(maps(shapes_cache).transpose(0, 2, 3, 1).reshape(-1, 32).copy())
    torch.manual_seed(0)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=32, d_sae=64, k=8))
    logs = saelens_fit(ref, rows, 2560, 128, lr_warm_up_steps=2, lr_decay_steps=4)  # 20 steps: every row twice
    with hookrun.open_run(result.path) as run:
        curves = run.sae_curves()
        assert run.sae["cache_rows"] == 1280 and run.sae["d_in"] == 32
    assert len(curves) == 20
    for row, want in zip(curves.rows, logs, strict=True):
        assert row["mse_loss"] == pytest.approx(want["losses/mse_loss"], rel=1e-6)
        assert row["explained_variance"] == pytest.approx(want["metrics/explained_variance"], rel=1e-6, abs=1e-9)
    assert_same_latents(tmp_path / "run" / "sae", ref, rows, tmp_path / "ref")


def test_silent_features_count_the_latents_silent_over_the_window_or_the_run_so_far(shapes_cache, tmp_path):
    """silent_features at each step: the latents that fired on no row of the last min(window + 1, steps)
    steps, read off SAELens' own trainer's activations step by step (the reference); past the window it is
    SAELens' dead_features, before it the latents never fired, which dead_features cannot count yet (a
    320-step run of experiment=sae_shapes logged dead_features 0 with 78 of its 128 latents never fired)."""
    torch.set_num_threads(1)
    window = 6
    cfg = hookrun.compose("experiment=sae_shapes", *FROM_CACHE(shapes_cache), "sae.budget=2560", "sae.batch_rows=128",
                          "sae.shuffle=false", "sae.d_sae=64", "sae.lr_schedule.warmup=2", f"+sae.dead_feature_window={window}",
                          "progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    result = hookrun.run(cfg)
    rows = torch.from_numpy(maps(shapes_cache).transpose(0, 2, 3, 1).reshape(-1, 32).copy())
    torch.manual_seed(0)
    fired: list[torch.Tensor] = []
    logs = saelens_fit(TopKTrainingSAE(TopKTrainingSAEConfig(d_in=32, d_sae=64, k=8)), rows, 2560, 128,
                       lr_warm_up_steps=2, lr_decay_steps=4, fired=fired, dead_feature_window=window)
    want = [int((~torch.stack(fired[max(0, s - window):s + 1]).any(0)).sum()) for s in range(len(fired))]
    with hookrun.open_run(result.path) as run:
        got = [int(r["silent_features"]) for r in run.sae_curves().rows]
    assert got == want and len(got) == 20
    assert [int(r["sparsity/dead_features"]) for r in logs[window:]] == want[window:]  # SAELens' own, past the window
    assert want[0] > 0 and all(int(r["sparsity/dead_features"]) == 0 for r in logs[:window])  # (a test that can fail)


def test_a_feature_map_needs_rows_channel(shapes_cache, tmp_path):
    cfg = hookrun.compose("experiment=sae_shapes", *FROM_CACHE(shapes_cache), "sae.rows=token", "progress=false",
                          f"hydra.run.dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match="give sae.rows=channel"):
        hookrun.run(cfg)


def test_on_the_fly_channel_rows_equal_a_raw_hook(tmp_path):
    """experiment=sae_shapes as shipped (on the fly, at: block3), smaller: its SAE equals SAELens'
    trainer on the rows a raw forward hook on tiny_cnn's block3 gives over the same images."""
    from hookrun.data import shapes
    from hookrun.models import tiny_cnn

    torch.set_num_threads(1)
    data = shapes(size=20, seed=0)
    images = torch.stack([data[i][0] for i in range(20)])
    model, seen = tiny_cnn().eval(), []
    model.block3.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        for lo in range(0, 20, 8):
            model(images[lo:lo + 8])
    rows = torch.cat(seen).movedim(1, -1).reshape(-1, 32)
    cfg = hookrun.compose("experiment=sae_shapes", "data.dataset.size=20", "data.batch_size=8", "sae.budget=2560",
                          "sae.batch_rows=128", "sae.shuffle=false", "sae.d_sae=64", "sae.lr_schedule.warmup=2",
                          "progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    result = hookrun.run(cfg)
    torch.manual_seed(0)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=32, d_sae=64, k=8))
    logs = saelens_fit(ref, rows, 2560, 128, lr_warm_up_steps=2, lr_decay_steps=4)  # 20 steps: every row twice
    with hookrun.open_run(result.path) as run:
        got = [r["mse_loss"] for r in run.sae_curves().rows]
    assert got == pytest.approx([w["losses/mse_loss"] for w in logs], rel=1e-5)
    assert_same_latents(tmp_path / "run" / "sae", ref, rows, tmp_path / "ref", tol=1e-4)
