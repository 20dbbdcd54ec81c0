"""hookrun.similarity (the similarity kind's notebook function) on a live model and data set equals
numpy's linear CKA on the features raw forward hooks record; the model comes back in its mode."""

from __future__ import annotations

import numpy as np
import pytest
from test_similarity_engine import cka
from test_similarity_runs import grams, images, recorded

import hookrun

AT = ["block1", "block3", "fc"]


def test_similarity_returns_numpys_linear_cka_as_a_labelled_array():
    pytest.importorskip("xarray")
    from hookrun.data.shapes import shapes
    from hookrun.models.tiny_cnn import tiny_cnn

    model = tiny_cnn().train()
    m = hookrun.similarity(model, shapes(24), batch_size=5, at=AT, pool="flatten")
    assert model.training  # (back in the mode it went in)
    assert list(m.dims) == ["at", "with_at"] and list(m.coords["at"].values) == AT
    k = grams(recorded(model.eval(), AT, images(24), "flatten"))
    np.testing.assert_allclose(m.values, [[cka(a, b) for b in k] for a in k], rtol=1e-6)
