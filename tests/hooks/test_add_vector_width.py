"""A steering vector (`op: add`, a list) of the wrong width for the axis it lies along. On tiny_lm's block
output (2, 5, 128) a 128-wide vector without `dim` lies along axis 1, the 5 positions: the run stopped with
PyTorch's "The size of tensor a (5) must match the size of tensor b (128) at non-singleton dimension 1",
naming neither the value nor the fix. Now one line names both widths and the dim that fits; with that dim
the result equals a raw forward hook adding the vector over the features."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError, RunError
from hookrun.models.tiny_lm import tiny_lm

AT = "transformer.h.0"


@pytest.fixture(scope="module")
def lm():
    return tiny_lm().eval()


def steer(lm, ids, **params):
    hooks = {"s": {"at": AT, "type": "forward", "actions": [{"name": "modify_output", "op": "add", **params}]}}
    with torch.no_grad(), hookrun.capture(lm, hooks):
        return lm(ids).logits


def test_a_vector_of_the_wrong_width_is_one_line_naming_both_widths(lm):
    ids = torch.randint(0, lm.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    vec = [i / 128 for i in range(128)]
    with pytest.raises((ConfigError, RunError)) as err:
        steer(lm, ids, value=vec)
    msg = str(err.value)
    assert "\n" not in msg and "value has 128 entries but dim 1 of the output (2, 5, 128) has 5; give dim: -1" in msg
    with pytest.raises((ConfigError, RunError), match=r"value has 3 entries but dim -1 of the output \(2, 5, 128\) has 128; give 128 entries"):
        steer(lm, ids, value=[1.0, 2.0, 3.0], dim=-1)
    block = dict(lm.named_modules())[AT]
    with torch.no_grad():  # the reference: a raw hook adding the vector over the features
        h = block.register_forward_hook(lambda m, a, o: (o[0] + torch.tensor(vec),) + tuple(o[1:]) if isinstance(o, tuple) else o + torch.tensor(vec))
        want = lm(ids).logits
        h.remove()
    torch.testing.assert_close(steer(lm, ids, value=vec, dim=-1), want)
    torch.testing.assert_close(steer(lm, ids, value=[0.5], dim=-1), steer(lm, ids, value=0.5))  # one entry: broadcast, as before


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_numpy_vector_lies_along_the_channels_as_a_list_does(dtype):
    """A numpy vector was taken for a scalar: numpy's broadcast laid it along the last axis (a float32 one
    silently: on a (2, 4, 4, 4) conv map it added over the width, not the 4 channels) or the float64 one
    stopped the run with 'op add returned ... torch.float64'. Reference: a raw hook adding it over axis 1."""
    torch.manual_seed(0)
    conv, x = torch.nn.Conv2d(3, 4, 3), torch.randn(2, 3, 6, 6)
    vec = np.array([1.0, -2.0, 3.0, 0.5], dtype=dtype)
    with torch.no_grad():
        h = conv.register_forward_hook(lambda m, a, o: o + torch.tensor(vec, dtype=torch.float64).float().view(1, 4, 1, 1))
        want = conv(x)
        h.remove()
        with hookrun.capture(conv, {"s": {"at": "", "type": "forward", "actions": [{"name": "modify_output", "op": "add", "value": vec}]}}):
            got = conv(x)
    torch.testing.assert_close(got, want)
