"""Where two configs differ: the dotted keys whose values are not the same.

    differing({"data": {"batch_size": 4}}, {"data": {"batch_size": 8}})  # ['data.batch_size']
    differing(old, new, ignore={"output.path", "resume"})               # keys under these do not count

Used by resume (an old file's config against this run's) and by the ranks of one run (each
rank's config against rank 0's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def differing(a: Any, b: Any, ignore: Iterable[str] = ()) -> list[str]:
    """The sorted dotted keys whose values differ between two config trees (a key present on one
    side only differs too); keys equal to, or under, one of `ignore` are left out."""
    ignored = tuple(ignore)
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) | set(fb)
                  if fa.get(k, _MISSING) != fb.get(k, _MISSING) and not _under(k, ignored))


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
