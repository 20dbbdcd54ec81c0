"""The shipped evaluation experiments (issue 20): experiment=sae_eval splices an SAE into the shipped
trained GPT-2 and evaluates it; experiment=ablation_sweep reports ce/kl per factor. References: the
clean model's own loss computed here with plain torch, and what an exact intervention must give
(error_term: the clean logits, so kl 0 and ce_intervened == ce_clean)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import h5py
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import hookrun

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")
LIMIT = ["data.dataset.limit=16", "data.batch_size=8", "device=cpu", "progress=false"]


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("h3")
    g = torch.Generator().manual_seed(0)
    d, n = 128, 256
    safetensors.save_file({"W_enc": torch.randn(d, n, generator=g) * 0.1, "W_dec": torch.randn(n, d, generator=g) * 0.1,
                           "b_enc": torch.zeros(n), "b_dec": torch.zeros(d)}, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": d, "d_sae": n, "dtype": "float32",
                                                 "apply_b_dec_to_input": True, "normalize_activations": "none",
                                                 "metadata": {"hook_name": "transformer.h.3"}}))
    return folder


def clean_ce(path) -> float:
    """Mean next-token cross-entropy of the shipped model on the run's stored tokens, padding excluded."""
    from hookrun.models import tiny_lm

    model = tiny_lm().eval()
    with h5py.File(path) as f:
        ids = torch.from_numpy(f["samples/input_ids"][:])
        mask = torch.from_numpy(f["samples/attention_mask"][:])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    keep = mask[:, 1:].bool()
    return float(F.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep]))


@pytest.mark.parametrize("error_term", [False, True])
def test_sae_eval_splices_and_evaluates_the_sae(tmp_path, sae_dir, error_term):
    cfg = hookrun.compose("experiment=sae_eval", f"params.sae={sae_dir}", f"params.error_term={str(error_term).lower()}",
                          f"output.path={tmp_path / 'e.h5'}", *LIMIT)
    path = hookrun.run(cfg).path
    table = hookrun.open_run(path).evaluation().to_pandas()
    row = table.set_index("module").loc["transformer.h.3"]
    assert row["ce_clean"] == pytest.approx(clean_ce(path), rel=1e-5)
    for metric in ("ce_ablated", "l0", "mse", "explained_variance", "dead_fraction", "ce_loss_score", "kl_div_score"):
        assert metric in table.columns
    if error_term:  # the model's output is its own: nothing changes
        assert row["ce_intervened"] == row["ce_clean"] and row["kl_intervened"] == 0
        assert row["ce_loss_score"] == 1
    else:  # a random SAE costs loss, less than zeroing the residual stream
        assert row["ce_clean"] < row["ce_intervened"] and row["kl_intervened"] > 0
    with h5py.File(path) as f:  # the latents of every real token are recorded
        n_tokens = int(f["samples/attention_mask"][:].sum())
        assert f["captures/latents/transformer.h.3.sae.latents/output"].shape == (n_tokens, 256)


def test_ablation_sweep_reports_ce_and_kl_per_factor(tmp_path):
    rows = {}
    for factor in (0.0, 1.0):
        cfg = hookrun.compose("experiment=ablation_sweep", f"params.factor={factor}", "data.dataset.limit=16",
                              "data.batch_size=8", "device=cpu", "progress=false", f"output.path={tmp_path / f'{factor}.h5'}")
        rows[factor] = hookrun.open_run(hookrun.run(cfg).path).evaluation().to_pandas().iloc[0]
    zero, one = rows[0.0], rows[1.0]
    assert zero["ce_intervened"] == pytest.approx(zero["ce_ablated"]) and zero["ce_loss_score"] == pytest.approx(0)
    assert one["ce_intervened"] == one["ce_clean"] and one["kl_intervened"] == 0 and one["ce_loss_score"] == 1
    assert zero["ce_ablated"] > zero["ce_clean"] + 1  # zeroing block 0's output costs the trained model a lot
