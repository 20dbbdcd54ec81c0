"""hookrun.modules(model, example) with an example the model cannot take (float64 images for a float32
ResNet, 5 channels for 3) is one ConfigError line naming the model's own message and what to give;
it was torch's RuntimeError traceback from inside the forward. No hook is left on the model, and the
shapes of a good example are those raw forward hooks see."""

from __future__ import annotations

import pytest
import torch
import torchvision

import hookrun
from hookrun.errors import ConfigError


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize(("x", "says"), [
    (torch.randn(2, 3, 32, 32, dtype=torch.float64), r"ResNet\(\[2, 3, 32, 32\] float64\) raised RuntimeError: "),
    (torch.randn(2, 5, 32, 32), r"ResNet\(\[2, 5, 32, 32\] float32\) raised RuntimeError: .*5 channels"),
])
def test_an_example_the_model_cannot_take_is_one_line(x, says):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    with pytest.raises(ConfigError, match=r"^modules: the model's forward failed: " + says) as info:
        hookrun.modules(model, x, match="layer1.*")
    assert "\n" not in str(info.value) and "give an example the model takes" in str(info.value)
    assert _hooks(model) == 0

    good = torch.randn(2, 3, 32, 32)
    seen = {}
    handles = [model.get_submodule(n).register_forward_hook(lambda m, a, o, n=n: seen.update({n: tuple(o.shape)}))
               for n in ("layer1.0", "layer1.1")]
    with torch.no_grad():
        model(good)
    for h in handles:
        h.remove()
    table = hookrun.modules(model, good, match="layer1.*")
    assert {m.name: m.outputs["output"] for m in table} == seen
