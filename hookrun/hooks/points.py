"""A hook point: one hook spec on one module or parameter, with its per-step call counter.

    point = HookPoint("fmap", "forward", "layer1.0", model.layer1[0])   # hook, type, module, target
    point.next_forward_call()  # 0, then 1 for a second call in the same forward pass
    split_site("transformer.h.0/add.1", set(dict(model.named_modules())))  # ("transformer.h.0", "add", 1)

`split_site` tells an op site's name (`MODULE/FN[.k]`) from a module's when a plan is made; the
sites themselves (hooks/sites.py) load only where a plan names one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

SITE = re.compile(r"^(?P<module>.*)/(?P<fn>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<call>\d+))?$")  # an op site's name (hooks/sites.py)


@dataclass
class HookPoint:
    """One hook spec on one module or parameter, with its per-step call counter."""

    hook: str
    type: str
    module: str  # the module's path ('' is the whole model) or the parameter's name
    target: Any  # nn.Module or nn.Parameter
    actions: list = field(default_factory=list)
    globbed: bool = False  # reached only through a glob of `at:` (not named there): may have nothing to record
    site: tuple | None = None  # an op site (hooks/sites.py): (FN, call or None); target is the module whose code calls FN
    axes: dict = field(default_factory=dict)  # an op site: (FN, k, role) -> axis names from its module's calls' structure (site_axes)
    forward_calls: int = 0  # a backward hook's firing is bound to the call that made it (hook_types._full_backward)

    def reset(self) -> None:
        self.forward_calls = 0

    def next_forward_call(self) -> int:
        self.forward_calls += 1
        return self.forward_calls - 1


def split_site(at: str, modules: set[str]) -> tuple[str, str, int | None] | None:
    """(module pattern, FN, call or None) of an op-site name; None where `at` names a module (a
    module whose own name holds a '/' stays a module)."""
    if at in modules:
        return None
    m = SITE.match(at)
    if not m:
        return None
    return m.group("module"), m.group("fn"), int(m.group("call")) if m.group("call") else None
