"""Where two configs differ: the dotted keys whose values are not the same.

    differing({"data": {"batch_size": 4}}, {"data": {"batch_size": 8}})  # ['data.batch_size']
    differing(old, new, ignore={"output.path", "resume"})               # keys under these do not count

Used by resume (an old file's config against this run's) and by the ranks of one run (each
rank's config against rank 0's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# keys that do not change what is captured (resume: config_differences, below)
IGNORED = {"resume", "dry_run", "progress", "imports", "output.overwrite", "output.max_bytes",
           "output.flush_every", "output.path", "output.compression", "data.num_workers", "output.staging",
           "output.part_bytes"}


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


def config_differences(old: dict, new: dict) -> list[str]:
    """The keys that change what is captured (IGNORED keys do not). A null key is the same as an
    absent one: a file written when a block of a kind not run was stored as its nulls
    (`patching: null`, evaluate's `{enabled: null, ...}`) resumes under a config without it. A
    block's `enabled: true` is the same as no `enabled`: a block given is on (a file written when
    `evaluate.ablation=zero` stored `enabled: null` resumes under the command that now stores true)."""
    return differing(_on_by_default(_without_nulls(old)), _on_by_default(_without_nulls(new)), IGNORED, ("the file's run", "this config"))


def _on_by_default(tree: dict) -> dict:
    """`tree` with each top-level block's `enabled: true` left out (a block given is on)."""
    return {key: ({k: v for k, v in block.items() if not (k == "enabled" and v is True)} if isinstance(block, dict) else block)
            for key, block in tree.items()}


def _without_nulls(tree: Any) -> Any:
    """`tree` without its null values, and without the mappings left empty by that alone."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for key, value in tree.items():
        kept = _without_nulls(value)
        if value is not None and not (kept == {} and value != {}):
            out[key] = kept
    return out
