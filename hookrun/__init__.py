"""hookrun: declarative PyTorch hooks, recorded to HDF5 or, in a notebook, to memory.

    from hookrun import run
    run({"model": {"_target_": "torchvision.models.resnet18"}, "data": {...}, "hooks": {...}})

    with hookrun.capture(model, {"f": {"at": "layer1.*", "type": "forward"}}) as cap:
        model(x)                                     # cap["layer1.0", "output"]: a tensor
    print(hookrun.modules(model, x))                 # every name `at:` accepts, with shapes
    grids = hookrun.patch_grid(model, items, sites={...})   # activation-patching grids (docs/patching.md)
    rows = hookrun.attribute(model, dataset, method="occlusion", window=[3, 8, 8])   # docs/attribution.md
"""

from importlib import import_module
from typing import Any

from hookrun.store.format import HOOKRUN_VERSION as __version__

# The package face, imported when first used (PEP 562): `python -m hookrun` loads the runner's
# modules only, not the readers, the notebook helpers or Hydra's compose API (about 0.1 s of every
# run's start; benchmarks/process_pair.py).
_FACE = {
    "open_run": "hookrun.analysis", "open_sweep": "hookrun.analysis",
    "Action": "hookrun.hooks.actions", "register_action": "hookrun.hooks.actions",
    "Captured": "hookrun.notebook.capture", "capture": "hookrun.notebook.capture",
    "modules": ("hookrun.notebook.lister", "list_modules"),
    "attribute": "hookrun.runner.kinds.attribution.notebook",
    "patch_grid": "hookrun.runner.kinds.patching.notebook",
    "RunResult": "hookrun.runner.run", "run": "hookrun.runner.run",
    "compose": "hookrun.cli.compose",
}

__all__ = ["Action", "attribute", "Captured", "RunResult", "__version__", "capture", "compose", "modules", "open_run", "open_sweep",
           "patch_grid", "register_action", "run"]


def __getattr__(name: str) -> Any:
    """`hookrun.NAME` for the names above, from their modules on first use (then cached here)."""
    where = _FACE.get(name)
    if where is None:
        raise AttributeError(f"module 'hookrun' has no attribute {name!r}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
