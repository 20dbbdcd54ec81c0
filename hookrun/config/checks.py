"""Which options may go together, and the range of each number: checked before anything is built.

    check_config(load(cfg))   # ConfigError, one line, at the first option that does not fit

The table below is the list of combinations of the common options refused whatever else the config
says; a run kind's refusals about its own block are the kind's (in its folder, hookrun/runner/kinds/<kind>/,
run by the kind's `check`), and those that need the built
model and hooks (a model without generate(), an ablation with nothing to ablate) its constructor's.

Where two configs differ: the dotted keys whose values are not the same.

    differing({"data": {"batch_size": 4}}, {"data": {"batch_size": 8}})  # ['data.batch_size']
    differing(old, new, ignore={"output.path", "resume"})               # keys under these do not count

Used by resume (an old file's config against this run's) and by the ranks of one run (each
rank's config against rank 0's).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError


class Refused(NamedTuple):
    option: str  # the option this row is about
    when: Callable[[HookrunConfig], bool]  # true: the config has the refused combination
    message: str  # the one line: what is wrong, and what would be right


# option           | refused when                                          | the line
TOGETHER: list[Refused] = [
    Refused("mode=grad", lambda c: c.mode is Mode.grad and c.loss is None,
            "mode=grad needs a loss: add loss=cross_entropy, loss=lm (a language model's next-token loss), "
            "loss=sum, loss=target_logit or loss=custom"),
    Refused("early_stop", lambda c: c.early_stop and c.mode is Mode.generate,
            "early_stop=true does not fit mode=generate: every model call's output makes the next token"),
    Refused("early_stop", lambda c: c.early_stop and c.mode is Mode.grad,
            "early_stop=true needs mode=eval: a backward pass needs the whole forward"),
    Refused("mode=generate", lambda c: c.mode is Mode.generate and c.loss is not None,
            "mode=generate runs no backward pass, so loss is unused: remove the loss, or use mode=grad"),
    Refused("resume", lambda c: c.resume and c.output.overwrite,
            "resume=true keeps the old file's batches and output.overwrite=true replaces the file: give one of them "
            "(resume=true to continue the run, output.overwrite=true to start it again)"),
]


# key                | first allowed, last allowed (None: no bound) | what the number is
RANGES: list[tuple[str, int | None, int | None, str]] = [
    ("data.limit", 1, None, "data.limit must be at least 1 (or null for all batches), got {value}"),
    ("output.flush_every", 1, None, "output.flush_every must be at least 1 (or null: every 2 seconds), got {value}"),
    ("data.batch_size", 1, None, "data.batch_size must be at least 1, got {value}"),
    ("data.num_workers", 0, None, "data.num_workers must be 0 or more, got {value}"),
    ("data.batch_size", None, sys.maxsize,
     "data.batch_size must be at least 1 and at most " + str(sys.maxsize) + ", got {value}"),
    ("seed", -(2**63), 2**64 - 1, "seed: {value} is out of range; use a whole number from 0 to " + str(2**64 - 1)
     + " (2**64 - 1)"),
]


def check_config(cfg: HookrunConfig) -> None:
    """Every row of TOGETHER, then every range, in order: the first that fails is one ConfigError."""
    fields = {"mode": cfg.mode.value}
    for row in TOGETHER:
        if row.when(cfg):
            raise ConfigError(row.message.format(**fields))
    for key, low, high, message in RANGES:
        value = lookup(cfg, key)
        if value is not None and ((low is not None and value < low) or (high is not None and value > high)):
            raise ConfigError(message.format(value=value))


def lookup(cfg: HookrunConfig, key: str) -> object:
    node: object = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def differing(a: Any, b: Any, ignore: Iterable[str] = (), sides: tuple[str, str] | None = None) -> list[str]:
    """The sorted dotted keys whose values differ between two config trees (a key present on one
    side only differs too); keys equal to, or under, one of `ignore` are left out. `sides` (what `a`
    and `b` are): a top-level block one side lacks is said once, with its keys as the other has them
    ("scaled (only in the file's run: {factor: 2.5}; add '+scaled={factor: 2.5}')"), not key by key."""
    ignored = tuple(ignore)
    fa, fb = flatten(a), flatten(b)
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k, _MISSING) != fb.get(k, _MISSING) and not _under(k, ignored))
    if sides is None:
        return keys
    whole = {k.split(".")[0] for k in keys if "." in k and (k.split(".")[0] in a) != (k.split(".")[0] in b)}
    return sorted({k for k in keys if k.split(".")[0] not in whole} | {_only_in(w, a, b, sides) for w in whole})


def _only_in(block: str, a: Any, b: Any, sides: tuple[str, str]) -> str:
    import yaml  # (loaded already where configs are read)

    side, tree = (sides[0], a) if block in a else (sides[1], b)
    given = yaml.safe_dump(tree[block], default_flow_style=True, width=10**6).strip()
    add = f"; add '+{block}={given}'" if tree is a else ""
    return f"{block} (only in {side}: {given}{add})"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value}; an empty mapping is a leaf ({}), so adding or removing one shows."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


_MISSING = object()
