"""hookrun: declarative PyTorch hooks, recorded to HDF5.

    from hookrun import run
    run({"model": {"_target_": "torchvision.models.resnet18"}, "data": {...}, "hooks": {...}})
"""

__version__ = "0.1.0"

from hookrun.actions import Action, register_action  # noqa: E402
from hookrun.analysis import open_run, open_sweep  # noqa: E402
from hookrun.runner import RunResult, run  # noqa: E402

__all__ = ["Action", "RunResult", "__version__", "open_run", "open_sweep", "register_action", "run"]
