"""MIB's signed ranking (CPR) of a `direction: noise` edges run, against MIB's own sign.

hannamw/EAP-IG's `get_scores_eap` takes the gradient at the clean run of MIB's metric with `loss=True`
(the negated logit difference) and multiplies it by (corrupted - clean) activations: an edge's score is
(a_clean - a_corrupt) . d m / d input at the clean run, positive where the edge carries the clean
behaviour. hookrun's noise run stores (a_corrupt - a_clean) . d m / d input at the clean run, the other
sign. The reference here computes MIB's scores with raw TransformerLens hooks (tests/edges/test_edges.py's
helpers) and evaluates them with tests/edges/test_mib_metrics.py's implementation of MIB's definitions.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from edge_graph import feeds, graph_labels
from test_edges import reader_grads, writer_acts
from test_mib_metrics import MIB, eap_ig_edges, hookrun_label, reference
from tl_models import hooked_transformer

import hookrun
from hookrun.circuits import main

V, L, H, T = 40, 2, 4, 6


def build():
    return hooked_transformer(V, n_layers=L, d_model=16, n_ctx=8, d_head=4, n_heads=H, act_fn="gelu", seed=3)


@pytest.fixture(scope="module")
def items():
    from edge_graph import prompt_pairs

    return prompt_pairs(V, T, seed=5, at=1, shift=11)


def mib_eap_scores(items) -> dict:
    """EAP-IG's get_scores_eap under MIB's metric (loss=True), by EAP-IG edge, averaged over the items."""
    model = build()
    writers, readers = graph_labels(L, H)
    total = np.zeros((len(writers), len(readers)))
    for it in items:
        clean, corrupt = writer_acts(model, it["clean"]), writer_acts(model, it["corrupt"])
        grads = reader_grads(model, it["clean"], it)  # d m / d reader input at the clean run
        for i, w in enumerate(writers):
            for j, r in enumerate(readers):
                if feeds(w, r):
                    total[i, j] += float(((clean[w] - corrupt[w]).double() * grads[r].double()).sum())
    total /= len(items)
    return {e: total[writers.index(a), readers.index(b)] for e in eap_ig_edges() for a, b in [hookrun_label(e)]}


def test_noise_runs_rank_cpr_and_export_by_mibs_sign(items, tmp_path):
    scores = mib_eap_scores(items)
    want = reference(build(), items, scores, MIB)
    path = tmp_path / "noise.h5"
    hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path), "overwrite": True},
                 "patching": {"method": "eap", "input": "input", "direction": "noise",
                              "faithfulness": {"fractions": "mib"}}}, model=build(), dataset=items)
    _, grid = hookrun.open_run(path).edges()
    np.testing.assert_allclose(grid.attrs["faithfulness_cpr_curve"], want["cpr"][0], atol=2e-5)
    assert grid.attrs["faithfulness_cpr"] == pytest.approx(want["cpr"][2], abs=2e-5)  # was -0.288 against 0.837
    assert grid.attrs["faithfulness_cmd"] == pytest.approx(want["cmd"][2], abs=2e-5)

    assert main(["export", str(path), "--format", "eap-ig", str(tmp_path / "g.json")]) == 0
    doc = json.loads((tmp_path / "g.json").read_text())["edges"]
    for (p, c, q), s in scores.items():  # MIB's sign, as its evaluation reads importances
        assert doc[f"{p}->{c}" + (f"<{q}>" if q else "")]["score"] == pytest.approx(s, abs=1e-6)

    again = hookrun.patch_grid(build(), items, input="input", method="eap",
                               faithfulness={"fractions": "mib", "from": str(path)})["edges"]  # the noise run's file
    assert again.attrs["faithfulness_cpr"] == pytest.approx(want["cpr"][2], abs=2e-5)
