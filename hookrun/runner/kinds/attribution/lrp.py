"""Layer-wise relevance propagation by zennit: its Gradient attributor with a named composite, on a copy
of the model (zennit's canonizers merge batch norms into the convolutions of the model they run on,
leaving a zero `bias` parameter on each: the user's model must come back as it went in).

    lrp = LRP(model, "epsilon_plus_flat")        # refused in one line where zennit cannot canonize it
    relevance = lrp.attribute(x, target, classes)

Canonizers: torchvision's ResNets (BasicBlock / Bottleneck) get zennit's ResNetCanonizer (batch norms
merged, the skip connection's sum made a module); other models with batch norm get
SequentialMergeBatchNorm, which merges a batch norm that directly follows a convolution or linear
layer; a model with no batch norm needs none.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from hookrun.errors import ConfigError

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class LRP:
    def __init__(self, model: nn.Module, composite: str) -> None:
        from zennit.composites import COMPOSITES

        self.model = copy.deepcopy(model).eval()
        self.canonizers = canonizers_for(self.model)
        self.composite = COMPOSITES[composite](canonizers=self.canonizers)

    def attribute(self, x: torch.Tensor, target: torch.Tensor, classes: int) -> torch.Tensor:
        from zennit.attribution import Gradient

        one_hot = torch.nn.functional.one_hot(target, classes).to(x.dtype)
        with Gradient(model=self.model, composite=self.composite) as attributor:
            _, relevance = attributor(x.detach().clone(), one_hot)
        return relevance


def canonizers_for(model: nn.Module) -> list:
    """The zennit canonizers a model needs, checked on it: every batch norm must be merged."""
    from torchvision.models.resnet import BasicBlock, Bottleneck
    from zennit.canonizers import SequentialMergeBatchNorm
    from zennit.torchvision import ResNetCanonizer

    norms = [name for name, m in model.named_modules() if isinstance(m, BATCH_NORMS)]
    if not norms:
        return []
    resnet = any(isinstance(m, BasicBlock | Bottleneck) for m in model.modules())
    canonizer = ResNetCanonizer() if resnet else SequentialMergeBatchNorm()
    probe = copy.deepcopy(model)  # (applied and removed on a copy: it changes what it merges)
    instances = canonizer.apply(probe)
    merged = {id(getattr(i, "batch_norm", None)) for i in instances}
    left = [name for name, m in probe.named_modules() if isinstance(m, BATCH_NORMS) and id(m) not in merged]
    for i in instances:
        i.remove()
    if left:
        raise ConfigError(f"attribution.method=lrp: zennit cannot canonize {type(model).__name__}: its batch norm(s) "
                          f"{', '.join(left[:4])}{' ...' if len(left) > 4 else ''} do not directly follow a convolution or "
                          f"linear layer, so zennit's canonizers cannot merge them; use another method (integrated_gradients)")
    return [canonizer]
