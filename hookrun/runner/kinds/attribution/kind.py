"""The attribution run kind: a step per batch of the data, its rows written as captures through the
store's normal path (flushes, crash safety, resume and the ranks' split of the batches come from it).

    python -m hookrun experiment=attribution_shapes hydra.run.dir=outputs/attr
    hookrun.open_run("outputs/attr").attribution()      # xarray: sample, channel, height, width

| capture                                   | dims                  | what                           |
|-------------------------------------------|-----------------------|--------------------------------|
| captures/attribution/AT/attribution       | sample, ... (engine)  | the attribution                |
| captures/attribution/AT/target            | sample                | the class attributed           |
| captures/attribution/AT/logit, prob       | sample                | the model's, for that class    |
| captures/attribution/AT/delta             | sample                | integrated gradients' convergence delta |
| captures/attribution/AT/deletion, insertion | sample, step        | measure: the target's probability |
| captures/attribution/AT/deletion_area, .. | sample                | their areas (trapezoid on [0, 1]) |

AT is the module attributed to (`__model__` for the input). The root attribute `attribution` (JSON)
holds the block as run and the budget measured on the first batch (reader.py).
User hooks (`hooks:`) record in one plain forward per batch; the attribution's own forwards run with
every action muted.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError
from hookrun.hooks import CLEAN
from hookrun.runner.extra_forwards import first_batch, own_copy
from hookrun.runner.kinds import NOTHING, KindContext, RunKind, StepAdds, plain_forward
from hookrun.runner.kinds.attribution.engine import Engine, dims_of
from hookrun.store.records import Capture, CaptureKey

HOOK = "attribution"


class AttributionKind(RunKind):
    block = "attribution"
    forwards = 2  # the logits' forward and the method's (integrated gradients: steps / batch; occlusion: windows)
    adds = ("captures/attribution",)

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        if cfg.mode is not Mode.eval:
            raise ConfigError(f"attribution with mode={cfg.mode.value}: the attribution runs its own forwards and "
                              f"backwards; leave mode=eval")

    def __init__(self, ctx: KindContext) -> None:
        super().__init__(ctx)
        self.spec_block = ctx.cfg.attribution  # (parsed and checked once, by load)
        ctx.model.eval()  # (a live model's mode comes back: hooks/actions/__init__.py: ModelHold)
        _, call = first_batch(ctx.loader, ctx.spec, size=ctx.cfg.data.batch_size)
        dataset = getattr(ctx.loader.dataset, "dataset", ctx.loader.dataset)  # under the Indexed wrapper
        self.engine = Engine(ctx.model, self.spec_block, call.to(ctx.device), dataset, ctx.spec,
                             planned=len(ctx.env.planned_samples))
        self.module = self.spec_block.layer or ""
        self.class_names = class_names(dataset, self.engine.classes)

    def prepare_run(self, p: Any) -> None:
        p.attrs["attribution"] = json.dumps(self.describe())

    def describe(self) -> dict:
        return {**self.spec_block.describe(), "budget": self.engine.budget.describe(), "classes": self.engine.classes,
                **({"class_names": self.class_names} if self.class_names else {})}

    def step(self, model: nn.Module, call: Any, session: Any) -> StepAdds:
        if self.ctx.points:  # the user's hooks record in a plain forward (of its own copy: a model may change its input in place)
            plain_forward(model, own_copy(call))
        with session.phase(CLEAN):
            rows = self.engine.batch(call)
        for capture in captures(rows, self.module):
            self.ctx.env.captures.add(capture)
        return NOTHING


def captures(rows: dict[str, torch.Tensor], module: str) -> list[Capture]:
    """A batch's rows as per-sample captures under captures/attribution/AT/ROLE, with their axis names."""
    out = []
    for role, value in rows.items():
        value = value.detach().cpu()
        dims = dims_of(tuple(value.shape)) if role == "attribution" else \
            ("sample", "step") if value.dim() == 2 else ("sample",)
        out.append(Capture(CaptureKey(HOOK, module, HOOK, role), value, False, dims=dims))
    return out


def class_names(dataset: Any, classes: int) -> list[str] | None:
    """The data set's class names (torchvision's `classes`, one per class of the model), for the pictures' captions."""
    names = getattr(dataset, "classes", None)
    if isinstance(names, list | tuple) and len(names) == classes and all(isinstance(n, str) for n in names):
        return list(names)
    return None
