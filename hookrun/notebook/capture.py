"""In-memory capture: the hooks of a config on a live model, records as tensors, for notebooks.

    with hookrun.capture(model, {"f": {"at": "layer1.*", "type": "forward", "actions": ["record"]}}) as cap:
        model(x)
    cap["layer1.0", "output"]  # a torch.Tensor: the rows of every forward inside the block

The same plan (make_plan), session (HookSession) and actions as a file run: only where the
records go differs. Each call of `model` inside the block is one step (one batch of a file run):
call counters restart, and its samples get the next sample indices (0, 1, ... across the block,
as a file run numbers a dataset read in order), so `noise` gives the numbers a file run gives.
Gradients (`loss.backward()` inside the block) reach tensor, backward and param hooks. Every hook
is removed when the block ends, on an exception too.

Around `model.generate(...)` every model call (the prompt, then each new token) is a step of the
same samples; `positions:` and `record rows: token` work as in mode=generate (padding and tokens
after a sample's end-of-sequence token, as model.generation_config names it, leave no row), and
`cap.tokens` maps each token row to its sample, position and whether it was generated.

With dtype="float16", values the cast made inf or 0 are counted and said at the block's end, as a
file run's end report says them (hooks/session.warn_cast).

Actions that keep a state over the run (top_examples) end with the block, as a file run's end:
`cap[module, "top.values"]` (and top.samples, top.positions) holds the block's top-k per feature.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookrun.config import parse_hooks
from hookrun.config.schema import DTYPES, Mode, StoreDtype
from hookrun.errors import ConfigError, RunError, call_role, capture_label
from hookrun.hooks import HOOK_TYPES
from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.plan import make_plan
from hookrun.hooks.session import HookSession, warn_cast, warn_never_fired
from hookrun.hooks.tokens import CallTracker
from hookrun.notebook.steps import Steps
from hookrun.store.listing import resolve
from hookrun.store.records import Capture, CaptureKey

Key = tuple[str, str, str]  # (hook, module, role); a role of a later call reads "output@1"


class Captured(Mapping):
    """The records of a `capture()` block: `cap[module, role]`, `cap[hook, module, role]` or
    `cap["hook/module/role"]` is a tensor with the rows of every step concatenated (per-step
    captures, such as parameter gradients, are stacked: one row per step)."""

    def __init__(self) -> None:
        self._parts: dict[Key, list[torch.Tensor]] = {}
        self._per_step: dict[Key, bool] = {}
        self._cache: dict[Key, torch.Tensor] = {}
        self._tokens: list[tuple] = []  # the token-row columns of each step that recorded per token
        self.casts: tuple[dict, dict] = ({}, {})  # values the record dtype's cast made inf / 0, by capture
        self.steps = 0

    def add(self, captures: list[Capture], tokens: tuple | None = None) -> None:
        if tokens is not None:
            self._tokens.append(tokens)
        for c in captures:
            key = _key(c.key)
            self._parts.setdefault(key, []).append(c.value)
            self._per_step[key] = c.per_step
            self._cache.pop(key, None)
            for counts, n in zip(self.casts, (c.overflow, c.underflow), strict=True):
                if n is not None and int(n):
                    at = (c.key.hook, c.key.module, c.key.role, c.key.call)
                    counts[at] = counts.get(at, 0) + int(n)

    @property
    def tokens(self) -> dict[str, torch.Tensor]:
        """The map of `rows: token` rows, in their order: sample index, position, generated (bool)."""
        names = ("sample", "position", "generated")
        out = {k: torch.cat([torch.from_numpy(t[i]) for t in self._tokens]) if self._tokens else torch.zeros(0, dtype=torch.long)
               for i, k in enumerate(names)}
        out["generated"] = out["generated"].bool()
        return out

    def keys(self) -> list[Key]:  # type: ignore[override]
        return list(self._parts)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __getitem__(self, key: Any) -> torch.Tensor:
        key = self.find(*(key if isinstance(key, tuple) else (key,)))
        if key not in self._cache:
            parts = self._parts[key]
            stack = torch.stack if self._per_step[key] else torch.cat
            try:
                self._cache[key] = stack(parts) if len(parts) > 1 or self._per_step[key] else parts[0]
            except RuntimeError:
                shapes = ", ".join(str(tuple(p.shape)) for p in parts[:4])
                raise RunError(f"{'/'.join(key)}: the forwards gave rows of different shapes ({shapes}, ...); "
                               f"cap.parts({key!r}) gives one tensor per forward") from None
        return self._cache[key]

    def parts(self, *key: str) -> list[torch.Tensor]:
        """One tensor per step (forward), for captures whose shape changes between forwards."""
        return list(self._parts[self.find(*key)])

    def find(self, *key: str) -> Key:
        """The full (hook, module, role) of `(module, role)`, `(hook, module, role)` or 'hook/module/role'
        (store/listing.resolve: the same names and errors as a file's `Run.find`)."""
        named = [_Named(*k) for k in self._parts]
        return resolve(named, key, empty="none (did the model run inside the block?)").key

    def __repr__(self) -> str:
        return f"Captured(steps={self.steps}, {{{', '.join(f'{self._label(k)}: {self._shape(k)}' for k in self._parts)}}})"

    def _label(self, key: Key) -> str:
        return capture_label(key[1], key[2], hook=key[0], sep="/")

    def _shape(self, key: Key) -> str:
        try:
            return str(tuple(self[key].shape))
        except RunError:
            return f"{len(self._parts[key])} forwards of different shapes"


def capture(model: nn.Module, hooks: Mapping, dtype: str = "keep") -> _Once:
    """Attach the `hooks:` mapping of a config to `model` for the block; records land in memory.

        with capture(model, {"g": {"at": "layer4", "type": "tensor", "actions": ["record"]}}) as cap:
            model(x).logsumexp(1).sum().backward()

    Hooks that need gradients are allowed (they fire when the block calls backward()). A hook
    that never fired in the block is a warning, as at the end of a file run.

    Args:
        model: the nn.Module to hook; every hook is removed when the block ends, also on an exception.
        hooks: the `hooks:` mapping of a config ({NAME: {at, type, actions}}).
        dtype: `output.dtype` of a file run: keep, float16 or float32 (a bfloat16 tensor is kept as
            bfloat16 here, where a file holds it as float32).

    Returns:
        Captured: `cap[module, role]` (or `cap[hook, module, role]`, `cap["hook/module/role"]`) is a
        tensor with the rows of every forward in the block; `cap.tokens` maps token rows.

    Raises:
        ConfigError / NotFoundError: a bad hook spec or module name, before anything is attached.
    """
    return _Once(_capture(model, hooks, dtype))


class _Once:
    """A capture block is entered once: a second `with` of the same object says so in one line."""

    def __init__(self, block: Any) -> None:
        self.block, self.used = block, False

    def __enter__(self) -> Captured:
        if self.used:
            raise ConfigError("capture: this hookrun.capture(...) was used by a block already; a capture is used "
                              "once: call hookrun.capture(model, hooks) again for another block")
        self.used = True
        return self.block.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.block.__exit__(*exc)


@contextmanager
def _capture(model: nn.Module, hooks: Mapping, dtype: str) -> Iterator[Captured]:
    if not isinstance(model, nn.Module):
        raise ConfigError(f"capture: expected a torch.nn.Module, got {type(model).__name__}")
    if dtype not in StoreDtype.__members__:
        raise ConfigError(f"capture: dtype={dtype!r}; choose from: {', '.join(sorted(StoreDtype.__members__))}")
    env = ActionEnv(store_dtype=DTYPES[dtype], bfloat16=torch.bfloat16)  # (in memory: a bfloat16 record stays bfloat16)
    cap = Captured()
    try:
        points = make_plan(model, parse_hooks(hooks), env, mode=Mode.grad)
        steps = Steps(env, cap)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = [] if eos is None else eos if isinstance(eos, list | tuple) else [eos]
        tracker = CallTracker(model, points, env.state, eos) if callable(getattr(model, "generate", None)) else nullcontext()
        with HookSession(points, env) as session, tracker:
            env.hold.on_close(model.register_forward_pre_hook(steps.begin(session), with_kwargs=True, prepend=True).remove)
            env.hold.on_close(model.register_forward_hook(steps.left, always_call=True).remove)
            env.hold.on_close(steps.direct(model))
            for target, name in {p.target: p.module for p in points if isinstance(p.target, nn.Module)}.items():
                if target is not model:  # (a hooked module called on its own, not inside the model: no step of its own)
                    env.hold.on_close(target.register_forward_pre_hook(steps.outside(model, name)).remove)
            try:
                yield cap
            finally:
                steps.end_step()
            cap.add([c for a in env.stateful for c in a.finish()])  # the block's end is a run's: top_examples' top.*
            warn_cast(*cap.casts)  # (float16's inf and 0, as a file run's end says them)
            for point in session.never_fired() if cap.steps else ():  # (not on an exception: the block may have stopped early)
                warn_never_fired(point.hook, point.module, "in the block", "so cap has no capture from it",
                                 HOOK_TYPES.get(point.type).needs_grad)
    finally:
        env.close()


@dataclass(frozen=True)
class _Named:
    """An in-memory key as store/listing.resolve sees it (a later call is in the role: output@1)."""

    hook: str
    module: str
    role: str
    call: int = 0

    @property
    def key(self) -> Key:
        return self.hook, self.module, self.role

    @property
    def label(self) -> str:
        return capture_label(self.module, self.role, hook=self.hook, sep="/")


def _key(key: CaptureKey) -> Key:
    return key.hook, key.module, call_role(key.role, key.call)
