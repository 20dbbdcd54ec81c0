"""early_stop: cut each forward pass once the last hook has fired, never losing a capture.

    stop = EarlyStop()
    stop.begin_step(-1); model(x[:1]); stop.end_step()   # the probe: learns where to stop
    stop.begin_step(step); model(x)  # hooks call stop.at_firing(point, call); StopForward cuts
    stop.end_step()                  # RunError where this batch fired differently from the probe

The first step to run learns the order of the hook firings and which module the forward calls
next after the last one. The runner makes that step a probe of one sample (the dataset's first
item) with every action muted (HookSession.probe), so no real batch computes what the capture does
not need, the head included. The probe itself stops once the forward has left the hooked modules
(probe_guard): at the first module call, after every hook has fired, that is not a hooked module,
inside one, an ancestor, a child of a hooked module's parent, or in a ModuleList, Sequential or
ModuleDict on a hooked module's path (where a loop may call it again). A probe that hooks a module
reachable under two names (T5's shared embedding) runs in full. What the probe cannot see: a
hooked module called again, after that point, by the code of a module two or more levels above it.

Every batch must then fire the same hooks in the same order, and after the last firing must go on
to that same module, where the forward is cut (before it runs). A batch that fires differently (a
module called more or fewer times, in another order, or called again after the stop point) stops
the run with a RunError naming it, rather than dropping captures.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from hookrun.errors import RunError, module_label
from hookrun.hooks import HookPoint, StopForward

ADVICE = "the hooked modules do not run the same way in every batch; run without early_stop"


class EarlyStop:
    def __init__(self) -> None:
        self.first: list[tuple[HookPoint, int]] | None = None  # batch 0's firings, in order
        self.after: nn.Module | None = None  # the module batch 0 called first after its last firing
        self._seen: list[tuple[HookPoint, int]] = []
        self._next: nn.Module | None = None
        self._pending = False
        self._pos = 0
        self._step = 0
        self._handle = None
        self.reference = "batch 0"  # what the firings were learned from (the probe: "the probe")
        self.guard: set[int] | None = None  # the probe: ids of the modules it may not stop at (probe_guard)
        self._points = 0  # the probe: how many points must fire before it may stop
        self._fired: set[int] = set()

    @property
    def learned(self) -> bool:
        return self.first is not None

    def stop_probe(self, guard: set[int] | None, points: int) -> None:
        """Let the coming probe stop at the first module call, after all `points` have fired, whose id
        is not in `guard` (probe_guard's; None: the probe runs in full)."""
        self.guard, self._points = guard, points

    def begin_step(self, step: int) -> None:
        """Step -1 is the probe: it learns the firings and stops only once past every hooked module."""
        if step < 0:
            self.reference = "the probe (the dataset's first sample)"
        self._step, self._pos, self._seen, self._next, self._pending = step, 0, [], None, False
        self._fired = set()
        self._remove()
        if self.first is None:
            self._handle = register_module_forward_pre_hook(self._note_next)

    def at_firing(self, point: HookPoint, call: int) -> None:
        if self.first is None:
            self._seen.append((point, call))
            self._fired.add(id(point))
            self._next, self._pending = None, True
            return
        pos = self._pos
        if pos >= len(self.first) or self.first[pos][0] is not point or self.first[pos][1] != call:
            raise RunError(f"early_stop: batch {self._step} fires hook {point.hook!r} at {_where(point, call)} "
                           f"where {self.reference} fired {self._expected(pos)}; {ADVICE}")
        self._pos = pos + 1
        if self._pos == len(self.first):  # the stop point: cut at the next module call
            self._handle = register_module_forward_pre_hook(self._cut)

    def end_step(self) -> None:
        self._remove()
        self.guard = None
        if self.first is None:
            self.first, self.after = self._seen, self._next
        elif self._pos != len(self.first):
            raise RunError(f"early_stop: batch {self._step} ended without firing {self._expected(self._pos)}, "
                           f"which {self.reference} fired; {ADVICE}")

    def close(self) -> None:
        self._remove()

    def _note_next(self, module: nn.Module, args: object) -> None:
        if self._pending:
            self._next, self._pending = module, False
        guard = self.guard
        if guard is not None and id(module) not in guard and len(self._fired) >= self._points:
            self._remove()  # past every hooked module: the rest of the probe's forward is not needed
            raise StopForward

    def _cut(self, module: nn.Module, args: object) -> None:
        self._remove()
        if module is not self.after:
            last, call = self.first[-1]
            then = f"a {type(self.after).__name__}" if self.after is not None else "nothing"
            raise RunError(f"early_stop: in batch {self._step} the forward goes on to a {type(module).__name__} after "
                           f"the stop point (hook {last.hook!r} at {_where(last, call)}), where {self.reference} called {then}: "
                           f"a hook could fire again after it; {ADVICE}")
        raise StopForward

    def _expected(self, pos: int) -> str:
        if self.first is None or pos >= len(self.first):
            return "nothing more"
        point, call = self.first[pos]
        return f"hook {point.hook!r} at {_where(point, call)}"

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def probe_guard(model: nn.Module, targets: Iterable[object]) -> set[int] | None:
    """The ids of the modules early_stop's probe may not stop at: each hooked module and everything
    inside it, its ancestors, every child of its parent (a module may call a child, a shared ReLU,
    again), and the whole of any ModuleList/Sequential/ModuleDict on its path (a loop over a stack
    of blocks may come back to a hooked one). None (the probe runs in full) where a target is not a
    module of `model` reached under exactly one name.

        probe_guard(gpt2, [gpt2.transformer.h[1]])   # h.*, transformer, the root: not ln_f, lm_head
    """
    parents: dict[int, nn.Module] = {}
    names: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        names[id(m)] = names.get(id(m), 0) + 1
        for child in m.children():
            parents[id(child)] = m
    guard: set[int] = set()
    for target in targets:
        if not isinstance(target, nn.Module) or names.get(id(target)) != 1:
            return None
        guard.update(id(m) for m in target.modules())
        node = target
        while id(node) in parents:
            parent = parents[id(node)]
            guard.add(id(parent))
            if node is target or isinstance(parent, CONTAINERS):
                guard.update(id(m) for m in parent.modules())
            node = parent
    return guard


def _where(point: HookPoint, call: int) -> str:
    return f"{module_label(point.module)}" + (f" (call {call})" if call else "")


@contextmanager
def probe_step(session: Any, sample_index: torch.Tensor, attention_mask: torch.Tensor | None = None,
               model: nn.Module | None = None, batch: Any = None) -> Iterator[None]:
    """HookSession.probe: a step of `session` with every action muted (its firings not counted), under
    early_stop told to stop once past every hooked module (probe_guard) where the `model` is given."""
    if session.early_stop is not None and model is not None:
        session.early_stop.stop_probe(probe_guard(model, (p.target for p in session.points)), len(session.points))
    muted = [list(p.actions) for p in session.points]
    fired = list(session.fired)
    for p in session.points:
        p.actions.clear()  # in place: each firing's closure holds this list
    try:
        session.begin_step(-1, len(sample_index), sample_index, attention_mask, batch)
        yield
        session.end_step()
    finally:
        for p, actions in zip(session.points, muted, strict=True):
            p.actions[:] = actions
        session.fired[:] = fired
