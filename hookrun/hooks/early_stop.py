"""early_stop: cut each forward pass once the last hook has fired, never losing a capture.

    stop = EarlyStop()
    stop.begin_step(-1); model(x[:1]); stop.end_step()   # the probe: learns where to stop
    stop.begin_step(step); model(x)  # hooks call stop.at_firing(point, call); StopForward cuts
    stop.end_step()                  # RunError where this batch fired differently from the probe

The first step to run in full learns the order of the hook firings and which module the forward
calls next after the last one. The runner makes that step a probe of one sample (the dataset's
first item) with every action muted (HookSession.probe), so no real batch computes what the
capture does not need, the head included. Every batch must then fire the same hooks in the same
order, and after the last firing must go on to that same module, where the forward is cut
(before it runs). A batch that fires differently (a module called more or fewer times, in another
order, or called again after the stop point) stops the run with a RunError naming it, rather than
dropping captures.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from hookrun.errors import RunError
from hookrun.hooks.points import HookPoint
from hookrun.labels import module_label

ADVICE = "the hooked modules do not run the same way in every batch; run without early_stop"


class StopForward(Exception):
    """Raised at the stop point of a step under early_stop: the rest of the forward is skipped."""


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

    @property
    def learned(self) -> bool:
        return self.first is not None

    def begin_step(self, step: int) -> None:
        """Step -1 is the probe: it learns the firings and is never cut."""
        if step < 0:
            self.reference = "the probe (the dataset's first sample)"
        self._step, self._pos, self._seen, self._next, self._pending = step, 0, [], None, False
        self._remove()
        if self.first is None:
            self._handle = register_module_forward_pre_hook(self._note_next)

    def at_firing(self, point: HookPoint, call: int) -> None:
        if self.first is None:
            self._seen.append((point, call))
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


def _where(point: HookPoint, call: int) -> str:
    return f"{module_label(point.module)}" + (f" (call {call})" if call else "")
