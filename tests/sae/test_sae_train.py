"""hookrun's SAE training equals SAELens 6's SAETrainer run directly on the same rows.

The reference is SAELens itself: its training-SAE config and SAETrainerConfig written out here by
hand, the cache's rows read here with h5py in file order (shuffle: false), the SAE built right after
torch.manual_seed(seed), `SAETrainer(...).fit()`, the per-step figures its
build_train_step_log_dict gives, and its own save_inference_model folder read by SAE.load_from_disk.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun

sae_lens = pytest.importorskip("sae_lens")
from sae_lens import SAE, SAETrainer  # noqa: E402
from sae_lens.config import SAETrainerConfig  # noqa: E402
from saelens_reference import saelens_fit  # noqa: E402

from hookrun.runner.kinds.sae.block import SaeBlock  # noqa: E402
from hookrun.runner.kinds.sae.data import CacheRows  # noqa: E402
from hookrun.runner.kinds.sae.engine import Training, save_sae  # noqa: E402
from hookrun.sae import load_sae  # noqa: E402

D_IN, D_SAE, BATCH, N_CACHE = 16, 64, 32, 400
CAPTURE = "mlp/0/output"
ARCHS = {  # the block's keys, and the same keys for SAELens' config class
    "standard": {"l1_coefficient": 2.0},
    "topk": {"k": 8},
    "batchtopk": {"k": 8},
    "jumprelu": {"l0_coefficient": 0.5, "jumprelu_init_threshold": 0.02},
    "matryoshka_batchtopk": {"k": 8, "matryoshka_widths": [16, 64]},
}
CLASSES = {"standard": sae_lens.StandardTrainingSAE, "topk": sae_lens.TopKTrainingSAE,
           "batchtopk": sae_lens.BatchTopKTrainingSAE, "jumprelu": sae_lens.JumpReLUTrainingSAE,
           "matryoshka_batchtopk": sae_lens.MatryoshkaBatchTopKTrainingSAE}


def make_cache(folder) -> str:
    """A cache run of 400 rows of 16 features: a Linear layer's output on random inputs."""
    cfg = {"model": {"_target_": "torchvision.ops.MLP", "in_channels": 8, "hidden_channels": [16]},
           "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N_CACHE, "shape": [8],
                                "num_classes": 2, "seed": 3}, "batch_size": 50},
           "device": "cpu", "progress": False, "output": {"path": str(folder / "captures.h5")},
           "hooks": {"mlp": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}}
    return str(hookrun.run(cfg).path)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return make_cache(tmp_path_factory.mktemp("sae_cache"))


def reference(cache: str, arch: str, rows: int, seed: int, lr_warmup: int, lr_decay_steps: int):
    """SAELens' trainer on the cache's rows in file order, again from the first row past the end."""
    with h5py.File(cache) as f:
        x = torch.from_numpy(f[f"captures/{CAPTURE}"][:].astype(np.float32))
    assert x.shape == (N_CACHE, D_IN)
    cfg_cls = {"standard": sae_lens.StandardTrainingSAEConfig, "topk": sae_lens.TopKTrainingSAEConfig,
               "batchtopk": sae_lens.BatchTopKTrainingSAEConfig, "jumprelu": sae_lens.JumpReLUTrainingSAEConfig,
               "matryoshka_batchtopk": sae_lens.MatryoshkaBatchTopKTrainingSAEConfig}[arch]
    keys = dict(ARCHS[arch])
    if arch in ("batchtopk", "matryoshka_batchtopk"):
        keys["k"] = float(keys["k"])
    torch.manual_seed(seed)
    sae = CLASSES[arch](cfg_cls(d_in=D_IN, d_sae=D_SAE, **keys))
    return sae, saelens_fit(sae, x, rows, BATCH, lr_warm_up_steps=lr_warmup, lr_decay_steps=lr_decay_steps)


def block(cache: str, arch: str, rows: int, **over) -> SaeBlock:
    b = SaeBlock(from_=cache, capture=CAPTURE, architecture=arch, d_sae=D_SAE, lr=1e-3, batch_rows=BATCH,
                 rows=rows, shuffle=False, lr_schedule={"warmup": 2, "decay": 0.2}, seed=5, **ARCHS[arch], **over)
    b.check()
    return b


@pytest.mark.parametrize("arch", list(ARCHS))
def test_training_equals_saelens_trainer(cache, arch, tmp_path):
    torch.set_num_threads(1)
    rows = 640  # 20 steps: the cache read once and 240 rows of a second pass (a batch spans the two)
    b = block(cache, arch, rows)
    data = CacheRows(b.from_, b.capture, b.batch_rows, b.shuffle)
    assert (data.n_rows, data.d_in, data.epochs_for(rows)) == (N_CACHE, D_IN, 2)
    train = Training(b, data.d_in, "0", data)
    sae = train.fit()
    data.close()
    ref, ref_logs = reference(cache, arch, rows, seed=5, lr_warmup=2, lr_decay_steps=4)  # decay 0.2 x 20 steps
    got, want = sae.state_dict(), ref.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5 * float(want[name].abs().max()))
    assert len(train.logs) == len(ref_logs) == 20
    for mine, theirs in zip(train.logs, ref_logs, strict=True):
        assert mine.keys() == {*theirs, "sparsity/silent_features"}  # (hookrun's own: test_sae_shapes.py checks it)
        for key in theirs:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-9), key
    assert train.logs[-1]["details/n_training_samples"] == rows
    assert train.logs[2]["details/current_learning_rate"] == pytest.approx(1e-3)  # warm after 2 steps
    # the folder written is SAELens' inference form, read back by SAELens and by hookrun's reader
    out = save_sae(sae, tmp_path / "sae")
    ref.save_inference_model(str(tmp_path / "ref"))
    loaded, ref_loaded = SAE.load_from_disk(str(out)), SAE.load_from_disk(str(tmp_path / "ref"))
    assert loaded.cfg.architecture() == ("jumprelu" if "batchtopk" in arch else arch)
    with h5py.File(cache) as f:
        x = torch.from_numpy(f[f"captures/{CAPTURE}"][:].astype(np.float32))
    with torch.no_grad():
        latents = loaded.encode(x)
        torch.testing.assert_close(latents, ref_loaded.encode(x), rtol=1e-5, atol=1e-5)
        if "batchtopk" not in arch:  # the inference form is the trained SAE itself
            torch.testing.assert_close(latents, sae.encode(x), rtol=1e-5, atol=1e-5)
        mine = load_sae(out)
        assert mine.hook_name == "0" and mine.d_in == D_IN
        torch.testing.assert_close(mine.encode(x), latents, rtol=1e-5, atol=1e-5)


def test_shuffled_training_learns_sparse_sums(tmp_path):
    """Rows that are sparse sums of 24 directions (a cache written by the store): a TopK SAE trained
    from the file in shuffled windows reconstructs them (numpy, from the folder SAELens reads)
    five times better than their mean does."""
    from hookrun.store.h5store import H5Store
    from hookrun.store.records import Capture, CaptureKey, StepRecord

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    d, n = 16, 3000
    dictionary = rng.standard_normal((24, d)).astype(np.float32)
    codes = rng.exponential(1.0, (n, 24)).astype(np.float32) * (rng.random((n, 24)) < 0.1)
    x = (codes @ dictionary).astype(np.float16)
    path = tmp_path / "cache.h5"
    with H5Store(path, {"config": "{}"}) as store:
        for step, lo in enumerate(range(0, n, 500)):
            cap = Capture(CaptureKey("res", "transformer.h.1", "forward", "output"), torch.from_numpy(x[lo:lo + 500]),
                          False)
            store.write(StepRecord(step, np.arange(lo, lo + 500), None, None, [cap]))
    b = SaeBlock(from_=str(path), capture="res/transformer.h.1/output", architecture="topk", k=4, d_sae=64, lr=3e-3,
                 batch_rows=128, rows=20 * n, shuffle={"buffer_rows": 1000, "seed": 0})
    b.check()
    data = CacheRows(b.from_, b.capture, b.batch_rows, b.shuffle)
    train = Training(b, data.d_in, data.info.module, data)
    out = save_sae(train.fit(), tmp_path / "sae")
    data.close()
    assert train.logs[-1]["losses/mse_loss"] < 0.2 * train.logs[0]["losses/mse_loss"]
    loaded = SAE.load_from_disk(str(out))
    rows = x.astype(np.float32)
    with torch.no_grad():
        x_hat = loaded(torch.from_numpy(rows)).numpy().astype(np.float64)
    err = ((x_hat - rows) ** 2).sum(1).mean()
    baseline = ((rows - rows.mean(0)) ** 2).sum(1).mean()
    assert err < 0.2 * baseline, (err, baseline)
    mine = load_sae(out)
    assert (mine.source, mine.architecture, mine.hook_name, mine.d_in, mine.d_sae) == (
        "saelens", "topk", "transformer.h.1", 16, 64)


def test_expected_norm_equals_saelens(cache, tmp_path):
    """normalize: expected_norm is SAELens' expected_average_only_in: its estimate batches taken from
    the stream before training, the scale folded into the weights when fit ends."""
    torch.set_num_threads(1)
    b = block(cache, "topk", 320, normalize="expected_norm", norm_batches=3)
    data = CacheRows(b.from_, b.capture, b.batch_rows, b.shuffle)
    train = Training(b, data.d_in, "0", data)
    sae = train.fit()
    data.close()
    with h5py.File(cache) as f:
        x = torch.from_numpy(f[f"captures/{CAPTURE}"][:].astype(np.float32))
    stream = torch.cat([x, x])
    torch.manual_seed(5)
    ref = sae_lens.TopKTrainingSAE(sae_lens.TopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=8,
                                                                  normalize_activations="expected_average_only_in"))
    SAETrainer(SAETrainerConfig(total_training_samples=320, train_batch_size_samples=BATCH, lr=1e-3, lr_end=1e-4,
                                lr_warm_up_steps=2, lr_decay_steps=2, n_batches_for_norm_estimate=3), ref,
               iter([stream[i * BATCH:(i + 1) * BATCH] for i in range(13)])).fit()
    got, want = sae.state_dict(), ref.state_dict()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5 * float(want[name].abs().max()))
    assert len(train.logs) == 10
    out = save_sae(sae, tmp_path / "sae")
    ref.save_inference_model(str(tmp_path / "ref"))
    with torch.no_grad():
        torch.testing.assert_close(SAE.load_from_disk(str(out)).encode(x),
                                   SAE.load_from_disk(str(tmp_path / "ref")).encode(x), rtol=1e-5, atol=1e-5)


def test_progress_false_hides_the_norm_estimates_bar_too(cache, capfd):
    """progress=false hid SAELens' training bar only: expected_norm's estimate ("Estimating norm scaling factor",
    sae_lens.training.activation_scaler's own tqdm) still drew its bar on stderr. Shown with progress on, as SAELens
    draws it; none with it off, and the SAE the same."""
    torch.set_num_threads(1)
    saes = {}
    for progress in (True, False):
        b = block(cache, "topk", 64, normalize="expected_norm", norm_batches=3)
        data = CacheRows(b.from_, b.capture, b.batch_rows, b.shuffle)
        saes[progress] = Training(b, data.d_in, "0", data).fit(progress=progress)
        data.close()
        err = capfd.readouterr().err
        assert ("Estimating norm scaling factor" in err) is progress, err
        assert ("Training SAE" in err) is progress, err
    for name, value in saes[True].state_dict().items():
        torch.testing.assert_close(saes[False].state_dict()[name], value, rtol=0, atol=0)
