"""The `sae:` kind on the fly (`at:`, no cache): the rows are the module's output on the run's own
data, padding dropped (the reference: transformers' GPT-2 with a raw forward hook on the inputs
experiment=sae_cache stores for the same data), and the training equals SAELens' SAETrainer on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import pytest
import torch
from conftest import ENV, HELPERS, ROOT

import hookrun
from hookrun.errors import ConfigError

transformers = pytest.importorskip("transformers")
sae_lens = pytest.importorskip("sae_lens")
from sae_kill_at_step import resume_line  # noqa: E402
from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: E402
from saelens_reference import assert_same_latents, saelens_fit  # noqa: E402

DATA = ("data.dataset.limit=16", "data.dataset.max_length=16", "data.batch_size=8")


def reference_rows(tmp_path) -> torch.Tensor:
    """transformer.h.3's output at every real token, by a raw hook on transformers' GPT-2."""
    cache = hookrun.run(hookrun.compose("experiment=sae_cache", *DATA, "progress=false",
                                        f"hydra.run.dir={tmp_path / 'inputs'}")).path
    with h5py.File(cache) as f:
        ids = torch.from_numpy(f["samples/input_ids"][:])
        mask = torch.from_numpy(f["samples/attention_mask"][:])
    model = transformers.GPT2LMHeadModel.from_pretrained(ROOT / "hookrun/models/tiny_lm", attn_implementation="eager").eval()
    seen = []
    model.transformer.h[3].register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        for lo in range(0, len(ids), 8):
            model(input_ids=ids[lo:lo + 8], attention_mask=mask[lo:lo + 8])
    return torch.cat([s[mask[i * 8:(i + 1) * 8].bool()] for i, s in enumerate(seen)])


def test_on_the_fly_rows_and_training_equal_saelens(tmp_path):
    torch.set_num_threads(1)
    rows = reference_rows(tmp_path)
    n = len(rows)
    budget = 2 * n + 64  # a second pass, and part of a third
    cfg = hookrun.compose("experiment=sae_train", "sae.from=null", "sae.capture=null", "sae.at=transformer.h.3",
                          "sae.shuffle=false", f"sae.rows={budget}", "sae.batch_rows=32", "sae.d_sae=256", "sae.k=16",
                          "sae.out=null", "sae.checkpoints=0", "sae.lr_schedule.warmup=4", *DATA, "progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    result = hookrun.run(cfg)
    steps = -(-budget // 32)
    torch.manual_seed(0)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=128, d_sae=256, k=16))
    logs = saelens_fit(ref, rows, budget, 32, lr_warm_up_steps=4, lr_decay_steps=int(0.2 * (budget // 32)))
    with hookrun.open_run(result.path) as run:
        curves = run.sae_curves()
        assert run.sae["at"] == "transformer.h.3" and run.sae["d_in"] == 128
    assert len(curves) == steps == len(logs)
    for row, want in zip(curves.rows, logs, strict=True):
        assert row["mse_loss"] == pytest.approx(want["losses/mse_loss"], rel=1e-5)
        assert row["explained_variance"] == pytest.approx(want["metrics/explained_variance"], rel=1e-5, abs=1e-7)
    loaded = assert_same_latents(tmp_path / "run" / "sae", ref, rows, tmp_path / "ref", tol=1e-4)
    assert loaded.cfg.metadata.hook_name == "transformer.h.3"


def test_on_the_fly_refuses_a_module_the_model_lacks(tmp_path):
    cfg = hookrun.compose("experiment=sae_train", "sae.from=null", "sae.capture=null", "sae.at=transformer.h.33",
                          *DATA, "progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match="did you mean 'transformer.h.3'"):
        hookrun.run(cfg)
    assert not (tmp_path / "run" / "captures.h5").exists()


@pytest.mark.slow
def test_on_the_fly_sigkill_then_resume_ends_equal_to_saelens(tmp_path, caplog):
    """Killed (SIGKILL) in step 9 of 12, then `resume=true`: the resumed run starts from the last
    checkpoint, runs the trained steps' forwards again to skip their rows, and its curves and SAE
    equal SAELens' SAETrainer on the rows a raw hook sees (the same as an uninterrupted run)."""
    torch.set_num_threads(1)
    rows = reference_rows(tmp_path)
    budget, batch = 12 * 32, 32
    overrides = ["experiment=sae_train", "sae.from=null", "sae.capture=null", "sae.at=transformer.h.3",
                 "sae.shuffle=false", f"sae.rows={budget}", f"sae.batch_rows={batch}", "sae.d_sae=256", "sae.k=16",
                 "sae.out=null", "sae.checkpoints=3", "sae.lr_schedule.warmup=4", "output.flush_every=1", *DATA, "progress=false",
                 f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run([sys.executable, str(HELPERS / "sae_kill_at_step.py"), "9", "compose", json.dumps(overrides)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, **ENV, "OMP_NUM_THREADS": "1"},
                          timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        kept = f["samples/index"].shape[0]  # the steps the writer flushed before the kill (up to 9)
    assert 0 < kept <= 9
    caplog.set_level("INFO", logger="hookrun")
    result = hookrun.run(hookrun.compose(*overrides, "resume=true"))
    assert result.status == "complete"
    assert resume_line(tmp_path / "run" / "checkpoints", kept, batch) in caplog.text
    torch.manual_seed(0)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=128, d_sae=256, k=16))
    logs = saelens_fit(ref, rows, budget, batch, lr_warm_up_steps=4, lr_decay_steps=int(0.2 * (budget // batch)))
    with hookrun.open_run(result.path) as run:
        curves = run.sae_curves()
    assert len(curves) == 12 == len(logs)
    for row, want in zip(curves.rows, logs, strict=True):
        assert row["mse_loss"] == pytest.approx(want["losses/mse_loss"], rel=1e-5)
        assert row["explained_variance"] == pytest.approx(want["metrics/explained_variance"], rel=1e-5, abs=1e-7)
    assert_same_latents(tmp_path / "run" / "sae", ref, rows, tmp_path / "ref", tol=1e-4)


def test_on_the_fly_refuses_a_broadcast_output_in_one_line(tmp_path):
    """transformer.wpe's output is [1, T, d] for a batch of 8 (reference: the raw module on position ids); the
    rows were once indexed by the batch's [8, T] mask: an IndexError traceback."""
    model = transformers.GPT2LMHeadModel.from_pretrained(ROOT / "hookrun/models/tiny_lm").eval()
    shape = tuple(model.transformer.wpe(torch.arange(16)[None]).shape)
    cfg = hookrun.compose("experiment=sae_train", "sae.from=null", "sae.capture=null", "sae.at=transformer.wpe",
                          "sae.rows=64", "sae.batch_rows=32", "sae.d_sae=64", "sae.k=4", "sae.out=null",
                          "sae.lr_schedule.warmup=0", *DATA, "progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError) as info:
        hookrun.run(cfg)
    msg = str(info.value)
    assert "\n" not in msg and f"has shape {shape}" in msg and "[8, 16]" in msg and "broadcast" in msg
    assert not (tmp_path / "run" / "sae").exists()


def test_a_sequence_of_tokens_is_no_feature_map(tmp_path):
    """transformer.h.3's (sample, token, feature) output, recorded per sample or read on the fly, with
    rows: channel: was trained on as a feature map, its 16 token positions the 'channels' (d_in 16, padding
    in), and a cache of it was told to use rows: channel. Reference: the capture's shape and dims by h5py,
    the batch's attention mask's shape."""
    cache = hookrun.run(hookrun.compose("experiment=sae_cache", *DATA, "progress=false", "hooks.res.at=[transformer.h.3]",
                                        "hooks.res.actions=[{name: record, what: output}]",
                                        f"hydra.run.dir={tmp_path / 'cache'}")).path
    with h5py.File(cache) as f:
        ds = f["captures/res/transformer.h.3/output"]
        assert ds.shape == (16, 16, 128) and list(ds.attrs["dims"]) == ["sample", "token", "feature"]
    common = ("experiment=sae_train", "sae.batch_rows=32", "sae.d_sae=64", "sae.k=4", "sae.out=null",
              "sae.lr_schedule.warmup=0", *DATA, "progress=false")
    for i, given in enumerate([(f"sae.from={cache}",), (f"sae.from={cache}", "sae.rows=channel", "sae.budget=64"),
                               ("sae.from=null", "sae.capture=null", "sae.at=transformer.h.3", "sae.rows=channel",
                                "sae.budget=64")]):
        with pytest.raises(ConfigError) as info:
            hookrun.run(hookrun.compose(*common, *given, f"hydra.run.dir={tmp_path / str(i)}"))
        msg = str(info.value)
        assert "\n" not in msg and not (tmp_path / str(i) / "captures.h5").exists()
        assert msg == ("sae.rows: channel reads a feature map's channel vectors; transformer.h.3's output (8, 16, 128) "
                       "is (sample, token, feature) under the attention mask: give rows: token" if i == 2 else
                       "sae.capture: res/transformer.h.3/output holds a sequence per row (sample, token, feature: "
                       "shape (16, 128), padding included), not a token's vector or a feature map; record it with "
                       "rows: token (a row per real token, as experiment=sae_cache does), or give sae.at (on the fly)")


def test_the_default_shuffle_buffer_holds_no_more_than_the_rows_training_draws(tmp_path, caplog):
    """sae.shuffle's default buffer is 1,000,000 rows; on the fly with a budget of 2048 rows it ran the
    model over 16 images (1024 rows a pass) 977 times to fill it before the first step. The buffer now
    holds what training draws (the budget): two passes, as the rows per pass say."""
    cfg = hookrun.compose("experiment=sae_shapes", "data.dataset.size=16", "data.batch_size=8", "sae.shuffle=true",
                          "sae.budget=2048", "sae.batch_rows=256", "sae.lr_schedule={warmup: 0, decay: 0}",
                          "progress=false", f"hydra.run.dir={tmp_path}")
    with caplog.at_level("INFO", logger="hookrun"):
        result = hookrun.run(cfg)
    per_pass = 16 * 8 * 8  # 16 images, a channel vector at each of block3's 8 x 8 positions
    passes = [r.getMessage() for r in caplog.records if "pass(es) over the data on the fly" in r.getMessage()]
    assert passes == [f"sae: {-(-2048 // per_pass)} pass(es) over the data on the fly"]
    with hookrun.open_run(result.path) as run:
        assert len(run.sae_curves()) == 2048 // 256
