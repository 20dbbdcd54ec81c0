"""The exact edge scores of benchmarks/mib_table.py (docs/edges.md's table): each edge's m_clean - m(every edge
kept but that one), against tests/edges/test_edges.py's raw-torch ablation (TransformerLens hooks rebuild every
reader's input, one item at a time) on a small HookedTransformer."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import test_edges as lens_ref
import test_edges_memory as bounded_ref
import torch
from conftest import ROOT
from tl_models import hooked_transformer


@pytest.fixture(scope="module")
def mib_table():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import mib_table
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return mib_table


def test_exact_edge_scores_equal_a_raw_torch_ablation(mib_table):
    model = hooked_transformer(lens_ref.V, n_layers=lens_ref.L, d_model=16, n_ctx=8, d_head=4, n_heads=lens_ref.H,
                               act_fn="gelu")
    items = bounded_ref.lens_items()
    got = mib_table.exact_scores(model, items, input="input")
    writers, readers = lens_ref.labels()
    edges = [(w, r) for w in writers for r in readers if lens_ref.feeds(w, r)]
    assert np.isfinite(got).sum() == len(edges)
    with torch.no_grad():
        clean = float(np.mean([float(lens_ref.metric(model(it["clean"][None]), it)) for it in items]))
    top = int(np.nanargmax(np.abs(got)))  # the largest effect, and three at random
    picks = [edges.index((writers[top // len(readers)], readers[top % len(readers)])),
             *np.random.default_rng(0).choice(len(edges), 3, replace=False)]
    for w, r in (edges[i] for i in picks):
        kept = set(edges) - {(w, r)}
        want = clean - lens_ref.reference_faithfulness(model, items, kept, "corrupt")
        assert got[writers.index(w), readers.index(r)] == pytest.approx(want, abs=1e-5), (w, r)
    assert np.nanmax(np.abs(got)) > 1e-2  # not a grid of zeros
