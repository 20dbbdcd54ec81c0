"""One owner of everything a run attaches to a model, undone in one place, last attached first.

    with ModelHold(model) as hold:          # a caller's live model: its state is noted first
        env = ActionEnv(hold=hold)          # splices, unfused attention, a lens' hook: hold.on_close(undo)
        with HookSession(points, env): ...  # the session's hook handles are held here too
    # every hook handle removed, every `.sae` child taken out, fused attention back on, then the
    # model's training and inplace flags, devices, requires_grad and .grad as they were

What a run attaches or changes, and who registers its undo here:
- the session's hook handles (hooks/session.py), a lens' unembed hook (hooks/actions/lens.py);
- a splice's `.sae` child module (hooks/splice.py), timm's fused attention turned off for op
  sites (hooks/plan.py);
- what an action opened for the run: a patch source's file (hooks/patch.py);
- a live model's own state (`ModelHold(model)`): run(cfg, model=m) and patch_grid(m, ...) hand
  the model back as it came in, on an exception too.

`close()` runs every undo even when one of them raises, then raises the first error; a second
`close()` has nothing left to do.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

Undo = Callable[[], None]


class ModelHold:
    def __init__(self, model: nn.Module | None = None) -> None:
        self._undo: list[Undo] = []
        if isinstance(model, nn.Module):
            self.on_close(_state_of(model))

    def on_close(self, undo: Undo) -> Undo:
        """Run `undo` when the hold closes (after everything registered later)."""
        self._undo.append(undo)
        return undo

    def forget(self, undo: Undo) -> None:
        """`undo` has been done already (a session that removed its own hooks)."""
        for i in range(len(self._undo) - 1, -1, -1):
            if self._undo[i] == undo:
                del self._undo[i]
                return

    @property
    def held(self) -> int:
        """How many undos are waiting."""
        return len(self._undo)

    def close(self) -> None:
        first: BaseException | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except BaseException as exc:  # the model must come back whole: every undo runs
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> ModelHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _state_of(model: nn.Module) -> Undo:
    """What a run may change on a live model, and how to put it back: every module's training and
    `inplace` flag, each parameter's and buffer's device, each parameter's requires_grad and .grad."""
    modes = [(m, m.training, getattr(m, "inplace", None)) for m in model.modules()]
    params = [(p, p.device, p.requires_grad, p.grad) for p in model.parameters()]
    buffers = [(b, b.device) for b in model.buffers()]
    for p in model.parameters():  # a .grad the model came with is set aside, untouched: the run's backward
        p.grad = None             # would add into it (mode=grad's first batch), and give it back changed

    def restore() -> None:
        for m, training, inplace in modes:
            m.training = training
            if inplace is not None:
                m.inplace = inplace
        for p, device, requires_grad, grad in params:
            if p.device != device:
                p.data = p.data.to(device)
            p.requires_grad_(requires_grad)
            p.grad = grad
        for b, device in buffers:
            if b.device != device:
                b.data = b.data.to(device)

    return restore


def disable_inplace(model: nn.Module) -> list[nn.Module]:
    """Turn off `inplace=True` (ReLU and friends) in `model` and every module inside it; the modules
    turned off. The numbers are the same, and full backward hooks cannot follow a tensor that a later
    module overwrites (mode=grad's runs: the whole model; a backward hook in hookrun.capture: its module)."""
    turned = [m for m in model.modules() if getattr(m, "inplace", None) is True]
    for m in turned:
        m.inplace = False
    return turned
