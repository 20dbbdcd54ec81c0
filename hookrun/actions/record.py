"""record: snapshot the tensors a hook sees and hand them to the writer.

    actions: [record]                          # every tensor the hook sees
    actions: [{name: record, what: output}]    # only the output (or [input, output], input.1, ...)

A snapshot is a copy taken when the hook fires, so a later in-place op (ReLU(inplace=True) after
bn1) cannot change what was recorded.
"""

from __future__ import annotations

import torch

from hookrun.actions import ACTIONS, Action
from hookrun.captures import Capture, CaptureKey
from hookrun.errors import ConfigError, one_of
from hookrun.events import Event, family


@ACTIONS.register("record")
class Record(Action):
    def __init__(self, point, hook_type, env, where: str = "", what: str | list[str] | None = None) -> None:
        super().__init__(point, hook_type, env, where)
        wanted = [what] if isinstance(what, str) else list(what or [])
        for w in wanted:
            if family(w) not in hook_type.roles:
                raise ConfigError(
                    f"{self.where}: record what={w!r} is not something a {hook_type.name} "
                    f"hook sees; choose from: {one_of(hook_type.roles)}"
                )
        self.what = tuple(wanted)

    def wants(self, role: str) -> bool:
        return not self.what or any(role == w or role.startswith(w + ".") for w in self.what)

    def __call__(self, ev: Event) -> None:
        state = ev.state
        for role, t in ev.tensors.items():
            if t is None or not self.wants(role):
                continue
            per_step = self.hook_type.per_step or t.dim() == 0 or t.shape[0] != state.batch_size
            key = CaptureKey(ev.hook, ev.module, ev.type, role, ev.call)
            self.env.captures.add(
                Capture(key, snapshot(t, self.env.store_dtype), per_step, str(t.dtype).replace("torch.", ""))
            )


def snapshot(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A detached CPU copy, in the storage dtype (bfloat16 becomes float32: numpy has no bf16)."""
    target = t.dtype
    if t.is_floating_point() and dtype is not None:
        target = dtype
    if target == torch.bfloat16:
        target = torch.float32
    return t.detach().to(device="cpu", dtype=target, copy=True)
