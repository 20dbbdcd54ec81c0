"""The plan's checks that only a rarer config needs, loaded where one is made: a pattern of `at:`
that names nothing (the closest names, the top-level modules), a module under a second name (one
object registered twice: a shared or reused block), two records of one tensor in one hook.

    raise unmatched(model, "layer9", names, "hooks.fmap.at", "module")   # NotFoundError: ... closest names: layer1, ...
    refuse_alias(model, "layers.1", "sae.at", then=ONCE_PER_FORWARD.format(w="sae"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from hookrun.errors import ConfigError, NotFoundError, close_matches

if TYPE_CHECKING:
    from hookrun.hooks import HookPoint


def unmatched(model: nn.Module, pattern: str, names: list[str], where: str, kind: str, glob: bool = False) -> Exception:
    """The one line for a pattern of `at:` that names nothing: a glob matching no name, a name the model
    lacks (a module's second name refused first, saying which module it is)."""
    if glob:
        return ConfigError(f"{where}: the pattern {pattern!r} matches no {_noun(kind)} of "
                           f"{type(model).__name__}; {_hint(pattern, names, kind)}")
    refuse_alias(model, pattern, where, kind)
    return NotFoundError(f"{where}: {type(model).__name__} has no {_noun(kind)} {pattern!r}; "
                         f"{_hint(pattern, names, kind)}")


# (what a one-call reader says of a second name: sae.at, attribution.at)
ONCE_PER_FORWARD = ("it runs once for each of its names, and {w} takes a module that runs once per forward: name "
                    "one outside it, or give each use a block of its own")


def refuse_alias(model: nn.Module, pattern: str, where: str, kind: str = "module", then: str | None = None) -> None:
    """A module registered under a second name (`nn.ModuleList([block] * 4)`: layers.1 is layers.0) is
    listed by named_modules() under its first name only: say which, and that its calls are captured apart."""
    if kind != "module":
        return
    target = dict(model.named_modules(remove_duplicate=False)).get(pattern)
    first = next((n for n, m in model.named_modules() if m is target), None) if target is not None else None
    if first is not None:
        raise ConfigError(f"{where}: {pattern!r} is the module {first!r} under a second name (one object, registered "
                          f"twice: a shared or reused block); " + (then or f"hook {first!r}: each of its calls in a "
                          f"forward is captured apart (output, output@1, ...; python -m hookrun.modules shows its calls)"))


def _noun(kind: str) -> str:
    return "parameter" if kind == "param" else "module"


def _hint(pattern: str, names: list[str], kind: str) -> str:
    close = close_matches(pattern.replace("*", "").replace("?", ""), [n for n in names if n])
    if close:
        return "closest names: " + ", ".join(close)
    if kind == "param":
        shown = names[:8] + (["..."] if len(names) > 10 else []) + names[-2:] if len(names) > 10 else names
        return f"its {len(names)} parameters include: " + ", ".join(shown)
    top = [n for n in names if n and "." not in n][:12]
    return f"top-level {_noun(kind)}s: " + ", ".join(top)


def check_record_twins(point: HookPoint) -> None:
    """Two records of one tensor in one hook are numbered in the order they fire in a call (output,
    output@1: before and after an edit); one that keeps other steps or stops sooner (every, limit)
    would hand its name to the other's rows once it skips a batch, so they must share every and limit."""
    records = [a for a in point.actions if type(a).__name__ == "Record"]
    for i, a in enumerate(records):
        for b in records[i + 1:]:
            same = not a.what or not b.what or any(x == y or x.startswith(y + ".") or y.startswith(x + ".")
                                                   for x in a.what for y in b.what)
            if same and (a.every, a.limit) != (b.every, b.limit):
                role = next((x for x in a.what if x in b.what), (a.what or b.what or ("its tensors",))[0])
                limits = [f"every: {r.every}, limit: {'null' if r.limit is None else r.limit}" for r in (a, b)]
                raise ConfigError(f"{b.where}: a second record of {role} in hook {point.hook!r} with another every/limit "
                                  f"({limits[0]}; here {limits[1]}); the two "
                                  f"are numbered by the order they fire ({role}, {role}@1), so once one skips a batch "
                                  f"the other's rows would take its name; give one of them a hook of its own (the same "
                                  f"at: under another name)")
