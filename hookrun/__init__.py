"""hookrun: declarative PyTorch hooks, recorded to HDF5 or, in a notebook, to memory.

    from hookrun import run
    run({"model": {"_target_": "torchvision.models.resnet18"}, "data": {...}, "hooks": {...}})

    with hookrun.capture(model, {"f": {"at": "layer1.*", "type": "forward"}}) as cap:
        model(x)                                     # cap["layer1.0", "output"]: a tensor
    print(hookrun.modules(model, x))                 # every name `at:` accepts, with shapes
    grids = hookrun.patch_grid(model, items, sites={...})   # a grid of clean-into-corrupted swaps (README)
    rows = hookrun.attribute(model, dataset, method="occlusion", window=[3, 8, 8])   # docs/attribution.md
    table = hookrun.probe(model, dataset, at=["layer1", "layer2"], target="label")   # docs/probe.md
    m = hookrun.similarity(model, dataset, at=["layer1", "layer2"])               # docs/similarity.md
"""

from typing import TYPE_CHECKING, Any

from hookrun.store import HOOKRUN_VERSION as __version__

__all__ = ["Action", "attribute", "Captured", "RunResult", "__version__", "capture", "compose", "modules", "open_run", "open_sweep",
           "patch_grid", "probe", "register_action", "run", "similarity"]

# the package face, imported when first used (PEP 562): `import hookrun` loads no runner, reader,
# action or kind; `hookrun.run` and `from hookrun import run` import hookrun/runner/__init__.py then
_FACE = {"open_run": "hookrun.analysis:open_run", "open_sweep": "hookrun.analysis:open_sweep",
         "Action": "hookrun.hooks.actions:Action", "register_action": "hookrun.hooks.actions:register_action",
         "Captured": "hookrun.notebook.capture:Captured", "capture": "hookrun.notebook.capture:capture",
         "modules": "hookrun.notebook.lister:list_modules",
         "RunResult": "hookrun.runner:RunResult", "run": "hookrun.runner:run",
         "compose": "hookrun.cli.compose:compose"}

if TYPE_CHECKING:  # what the face names, for type checkers and editors
    from hookrun.analysis import open_run, open_sweep
    from hookrun.cli.compose import compose
    from hookrun.hooks.actions import Action, register_action
    from hookrun.notebook.capture import Captured, capture
    from hookrun.notebook.lister import list_modules as modules
    from hookrun.runner import RunResult, run
    from hookrun.runner.kinds.patching.notebook import patch_grid
    from hookrun.runner.kinds.probe.notebook import probe
    from hookrun.runner.kinds.similarity.notebook import similarity


def __getattr__(name: str) -> Any:
    """The face's names, imported when first used (`hookrun.compose` builds no Hydra app until then:
    the CLI's module registers its schema and finds its config folder when it is imported), and a
    kind plugin's notebook function (hookrun.attribute), bound through hookrun.config.plugins."""
    import importlib
    import importlib.util

    if name in _FACE:
        module, _, attr = _FACE[name].partition(":")
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule not yet imported (hookrun.models)
        raise AttributeError(f"module 'hookrun' has no attribute {name!r}")
    from hookrun.config.plugin_parts import notebook_function

    fn = notebook_function(name)  # a kind's notebook function (only that kind is imported)
    if fn is not None:
        return fn
    raise AttributeError(f"module 'hookrun' has no attribute {name!r}")
