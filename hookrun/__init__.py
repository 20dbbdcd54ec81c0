"""hookrun: declarative PyTorch hooks, recorded to HDF5.

    from hookrun import run
    run({"model": {"_target_": "torchvision.models.resnet18"}, "data": {...}, "hooks": {...}})
"""

from hookrun.analysis import open_run, open_sweep
from hookrun.capture.actions import Action, register_action
from hookrun.runner.run import RunResult, run
from hookrun.store.format import HOOKRUN_VERSION as __version__

__all__ = ["Action", "RunResult", "__version__", "open_run", "open_sweep", "register_action", "run"]
