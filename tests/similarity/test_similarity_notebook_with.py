"""hookrun.similarity(model, data, with_=other_model): the second model given as with_ itself, not the
block's with: mapping, is one line before any forward naming the form to give ({'model': ..., 'at':
[...]}); it said 'similarity.with: a TinyCNN object cannot be in a config ...; name what builds it:
{_target_: package.module.Name, ...}', a config's answer. The form it names equals numpy's linear CKA
between the two models' outputs by raw forward hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_similarity_engine import cka
from test_similarity_runs import grams, images, recorded

import hookrun
from hookrun.errors import ConfigError


def test_a_model_given_as_with_is_one_line_and_the_form_it_names_is_numpys_cka():
    pytest.importorskip("xarray")
    from hookrun.data.shapes import shapes
    from hookrun.models.tiny_cnn import tiny_cnn

    model = tiny_cnn().eval()
    torch.manual_seed(7)
    other = tiny_cnn().eval()
    for p in other.parameters():  # other weights than the first model's
        torch.nn.init.normal_(p, std=0.2)
    seen = []
    h = model.register_forward_hook(lambda *a: seen.append(1))
    with pytest.raises(ConfigError, match=r"^similarity: with_ is the block's with:, a dict \{'model': \.\.\., 'at': "
                                          r"\[\.\.\.\]\}; got a TinyCNN: give with_=\{'model': other"):
        hookrun.similarity(model, shapes(12), batch_size=4, at=["block3"], with_=other)
    h.remove()
    assert not seen

    m = hookrun.similarity(model, shapes(12), batch_size=4, at=["block3"], with_={"model": other, "at": ["block1", "fc"]},
                           pool="flatten")
    x = images(12)
    mine, theirs = grams(recorded(model, ["block3"], x, "flatten")), grams(recorded(other, ["block1", "fc"], x, "flatten"))
    np.testing.assert_allclose(m.values, [[cka(mine[0], t) for t in theirs]], rtol=1e-6)
