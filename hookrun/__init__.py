"""hookrun: declarative PyTorch hooks, recorded to HDF5 or, in a notebook, to memory.

    from hookrun import run
    run({"model": {"_target_": "torchvision.models.resnet18"}, "data": {...}, "hooks": {...}})

    with hookrun.capture(model, {"f": {"at": "layer1.*", "type": "forward"}}) as cap:
        model(x)                                     # cap["layer1.0", "output"]: a tensor
    print(hookrun.modules(model, x))                 # every name `at:` accepts, with shapes
    grids = hookrun.patch_grid(model, items, sites={...})   # a grid of clean-into-corrupted swaps (README)
    rows = hookrun.attribute(model, dataset, method="occlusion", window=[3, 8, 8])   # docs/attribution.md
"""

from typing import Any

from hookrun.analysis import open_run, open_sweep
from hookrun.hooks.actions import Action, register_action
from hookrun.notebook.capture import Captured, capture
from hookrun.notebook.lister import list_modules as modules
from hookrun.runner.kinds import patch_grid
from hookrun.runner.run import RunResult, run
from hookrun.store.format import HOOKRUN_VERSION as __version__

__all__ = ["Action", "attribute", "Captured", "RunResult", "__version__", "capture", "compose", "modules", "open_run", "open_sweep",
           "patch_grid", "register_action", "run"]


def __getattr__(name: str) -> Any:
    """`hookrun.compose` is imported when first used: importing hookrun builds no Hydra app (the
    CLI's module registers its schema and finds its config folder when it is imported)."""
    if name == "compose":
        from hookrun.cli.compose import compose

        return compose
    from hookrun.config.plugins import loaded_plugins, plugin, plugin_names

    for kind in [*loaded_plugins(), *(plugin(n) for n in plugin_names())]:  # a kind's notebook function
        fn = kind.notebook if isinstance(kind.notebook, str) else getattr(kind.notebook, "__name__", None)
        if fn is not None and fn.rpartition(":")[2] == name:
            return kind.notebook_function()
    raise AttributeError(f"module 'hookrun' has no attribute {name!r}")
