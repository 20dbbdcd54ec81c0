"""Attention pictures of signed scores (the tensor a softmax turns into the pattern: TransformerLens'
hook_attn_scores, a softmax op site's input): they were drawn like probabilities, on viridis from
the lowest to the highest value, so a score of 0 had no colour of its own; the causal mask's cells
(-inf) were white in plot, uncounted; and transformers' eager attention fills them with
torch.finfo(float32).min, which stretched both commands' scale to -3.4e38: every real score one colour.
Now: one diverging scale centred on 0 over a sample's heads, the mask's cells grey and counted, and
probabilities still on 0..1. plot shared one scale over every sample drawn while the report took one per
sample; both now take one per sample (sample_scale), and the colour bar says so. Checked against the
file's values read with h5py."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from op_models import gpt2

import hookrun
from hookrun.analysis.report import run_data

pytest.importorskip("matplotlib")
from hookrun.cli import figures  # noqa: E402
from hookrun.cli.plot_command import main as plot_main  # noqa: E402

LOWEST = float(torch.finfo(torch.float32).min)


def record(tmp_path, what: str, hook_type: str) -> tuple:
    """A 2-layer GPT-2 (eager attention) on 2 unpadded prompts of 8 tokens: its layer-0 softmax's
    `what`; the file and that capture's two rows as h5py reads them."""
    g = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(0, 50, (8,), generator=g)} for _ in range(2)]
    cfg = {"hooks": {"a": {"at": "transformer.h.0.attn/softmax", "type": hook_type, "actions": [{"name": "record", "what": what}]}},
           "data": {"batch_size": 2, "target": None}, "progress": False, "output": {"path": str(tmp_path / f"{what}.h5")}}
    path = hookrun.run(cfg, model=gpt2(2), dataset=items).path
    with h5py.File(path, "r") as f:
        (name,) = [n for n in f["captures/a"]]
        return path, f[f"captures/a/{name}/{what}"][()].astype(np.float64)


def plotted(tmp_path, monkeypatch, path) -> object:
    seen, save = [], figures.save
    monkeypatch.setattr(figures, "save", lambda fig, p, *a, **k: (seen.append((p.name, fig)), save(fig, p, *a, **k))[1])
    assert plot_main([str(path), "--out", str(tmp_path / "fig")]) == 0
    (fig,) = [fig for name, fig in seen if name.startswith("attn_")]
    return fig


def reported(path) -> list[dict]:
    with hookrun.open_run(path) as run:
        (section,) = [s for s in run_data(run)["sections"] if s["id"] == "attention"]
    return [f["figure"]["data"][0] for item in section["items"] for f in item["figures"]]


def test_masked_scores_are_grey_and_the_rest_diverge_about_zero_in_plot_and_report(tmp_path, monkeypatch):
    path, scores = record(tmp_path, "input", "forward_pre")
    masked = scores <= LOWEST / 2  # transformers' eager causal mask: torch.finfo(float32).min
    assert masked.sum() == 2 * 4 * 28 and (scores[~masked] < 0).any() and (scores[~masked] > 0).any()
    tops = [np.abs(scores[s][~masked[s]]).max() for s in range(2)]  # each sample's heads: its one scale (plot's, report's)
    assert tops[0] != pytest.approx(tops[1], rel=1e-3)  # (plot had one scale over both samples)
    fig = plotted(tmp_path, monkeypatch, path)
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) == 2 * 4
    bars = [ax.get_ylabel() for ax in fig.axes if not ax.images and ax.get_ylabel()]
    assert bars == ["input value (one scale per sample, shared by its heads)"] * 2
    for k, ax in enumerate(maps):
        image = ax.images[0]
        np.testing.assert_allclose(image.get_clim(), (-tops[k // 4], tops[k // 4]), rtol=1e-6)
        assert image.get_cmap().name == "hookrun_diverging"
        assert ax.get_facecolor()[:3] == pytest.approx(tuple(int("bdbdbd"[i:i + 2], 16) / 255 for i in (0, 2, 4)))
    first = np.ma.filled(maps[0].images[0].get_array().astype(np.float64), np.nan)
    np.testing.assert_allclose(first[~masked[0, 0]], scores[0, 0][~masked[0, 0]], rtol=1e-6)
    assert not np.isfinite(first[masked[0, 0]]).any()  # (no colour: the face behind, grey)
    assert f"({masked.sum()} cells masked, NaN or inf: grey, no value)" in fig._suptitle.get_text()
    traces = reported(path)
    assert len(traces) == 2 * 4
    for k, trace in enumerate(traces):
        s, h = divmod(k, 4)
        z = np.array([[np.nan if v is None else v for v in row] for row in trace["z"]])
        np.testing.assert_allclose(z, np.where(masked[s, h], np.nan, scores[s, h]), rtol=1e-6)
        one = np.abs(scores[s][~masked[s]]).max()  # the report's scale: the sample's heads
        assert trace["zmid"] == 0 and trace["zmin"] == pytest.approx(-one) and trace["zmax"] == pytest.approx(one)
        assert not isinstance(trace["colorscale"], str)  # (the diverging stops, not "Viridis")
        assert trace["colorbar"]["title"]["text"].startswith("input (one scale per sample, shared by its heads)")


def test_probabilities_stay_on_zero_to_one_in_plot_and_report(tmp_path, monkeypatch):
    path, probs = record(tmp_path, "output", "forward")
    assert probs.min() >= 0 and probs.max() <= 1 and np.isfinite(probs).all()
    fig = plotted(tmp_path, monkeypatch, path)
    for ax in (ax for ax in fig.axes if ax.images):
        assert ax.images[0].get_clim() == (0.0, 1.0) and ax.images[0].get_cmap().name == "viridis"
    assert "no value" not in fig._suptitle.get_text()
    for trace in reported(path):
        assert (trace["zmin"], trace["zmax"], trace["colorscale"]) == (0.0, 1.0, "Viridis") and "zmid" not in trace


class MaskedScores(torch.nn.Module):
    """One attention's scores, causally masked the way other code does it: `masked_fill(~causal, fill)`
    (-1e9: the annotated transformer; -10000: older transformers GPT-2's masked_bias) or `scores + fill`
    where masked (BERT's extended attention mask, -10000 * (1 - mask)), then the softmax."""

    def __init__(self, fill: float, additive: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.qk = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 32)
        self.fill, self.additive = fill, additive

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(self.emb(input_ids)).view(*input_ids.shape, 2, 2, 8).unbind(2)
        scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) * 3  # (sample, head, query, key)
        masked = ~torch.ones(input_ids.shape[1], input_ids.shape[1], dtype=torch.bool).tril()
        scores = scores + masked * self.fill if self.additive else scores.masked_fill(masked, self.fill)
        return torch.softmax(scores, -1)


def record_scores(tmp_path, model: torch.nn.Module, at: str, hook_type: str) -> object:
    """2 prompts of 8 tokens given as `input` (HookedTransformer.forward's, Sequential's) to `model`: the file."""
    g = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(0, 40, (8,), generator=g)} for _ in range(2)]
    what = "input" if hook_type == "forward_pre" else "output"
    cfg = {"hooks": {"a": {"at": at, "type": hook_type, "actions": [{"name": "record", "what": what}]}},
           "data": {"batch_size": 2, "target": None, "inputs": {"input": "input_ids"}}, "progress": False, "output": {"path": str(tmp_path / "s.h5")}}
    return hookrun.run(cfg, model=model, dataset=items).path


@pytest.mark.parametrize(("fill", "additive"), [(-1e4, False), (-1e4, True), (-1e9, False), ("tl", None)],
                         ids=["fill_-10000", "bert_additive_-10000", "fill_-1e9", "transformer_lens_-inf"])
def test_every_usual_mask_fill_is_grey_and_the_scale_spans_the_real_scores(tmp_path, monkeypatch, fill, additive):
    if fill == "tl":  # TransformerLens 3.9: torch.where(causal, scores, IGNORE), IGNORE = -inf, before hook_attn_scores
        from tl_models import hooked_transformer

        path = record_scores(tmp_path, hooked_transformer(d_vocab=40), "blocks.0.attn.hook_attn_scores", "forward")
    else:
        path = record_scores(tmp_path, torch.nn.Sequential(MaskedScores(fill, additive)), "0/softmax", "forward_pre")
    with h5py.File(path, "r") as f:
        (ds,) = _datasets(f["captures/a"])
        scores = ds[()].astype(np.float64)
    upper = np.triu(np.ones((8, 8), dtype=bool), 1)  # the causal mask's cells, in each sample and head
    masked = np.broadcast_to(upper, scores.shape)
    assert (scores[masked] <= -1e4 + 20).all() and (np.abs(scores[~masked]) < 20).all()  # the file: fills and real scores
    fig = plotted(tmp_path, monkeypatch, path)
    maps = [ax for ax in fig.axes if ax.images]
    for k, ax in enumerate(maps):
        s, h = divmod(k, scores.shape[1])
        top = np.abs(scores[s][~masked[s]]).max()  # the sample's heads: its one scale
        np.testing.assert_allclose(ax.images[0].get_clim(), (-top, top), rtol=1e-6)
        shown = np.ma.filled(ax.images[0].get_array().astype(np.float64), np.nan)
        np.testing.assert_allclose(shown[~upper], scores[s, h][~upper], rtol=1e-6)
        assert np.isnan(shown[upper]).all()  # (grey: the face behind)
    assert f"({masked.sum()} cells masked, NaN or inf: grey, no value)" in " ".join(fig._suptitle.get_text().split())
    for k, trace in enumerate(reported(path)):
        s, h = divmod(k, scores.shape[1])
        z = np.array([[np.nan if v is None else v for v in row] for row in trace["z"]])
        np.testing.assert_allclose(z, np.where(upper, np.nan, scores[s, h]), rtol=1e-6)
        one = np.abs(scores[s][~masked[s]]).max()
        assert trace["zmin"] == pytest.approx(-one) and trace["zmax"] == pytest.approx(one)


def _datasets(group) -> list:
    found = []
    group.visititems(lambda _, o: found.append(o) if isinstance(o, h5py.Dataset) else None)
    return found
