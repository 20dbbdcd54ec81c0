"""A kind's block on a live model and data set, run to a temporary file and read back: what the
notebook functions of kinds whose results are small (hookrun.probe, hookrun.similarity) return.

    table = temporary_run("probe", block, model, dataset, 16, None, read=lambda f: read_probes(f))

The same config path, checks, pass and writer as a file run; the file is removed once `read(f)` (an
open h5py.File) has taken what it returns. The model stays on its device and comes back as it went in.
`live=(VAR, obj)` hands a block's live object (a second model, a test set) to the kind for this run:
the ContextVar holds it while the run lasts (the block's node names only its class). A Ctrl-C (a
notebook's interrupt) is a KeyboardInterrupt that says nothing was kept: the file a run's Interrupted
names, and resume=true, go with the temporary folder.
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from torch import nn

from hookrun.errors import ConfigError


def temporary_run(kind: str, block: dict, model: nn.Module, dataset: Any, batch_size: int, inputs: Any,
                  read: Callable[[Any], Any], live: tuple[ContextVar, Any] | None = None) -> Any:
    """`read(file)` of the run of `{kind: block}` on `model` and `dataset` (data.batch_size, data.inputs)."""
    import h5py

    from hookrun.output.process import Interrupted
    from hookrun.runner import run  # (the runner's face: the same run a config makes)

    if not isinstance(model, nn.Module):
        raise ConfigError(f"{kind}: expected a torch.nn.Module, got {type(model).__name__}")
    device = next((p.device for p in model.parameters()), "cpu")
    token = live[0].set(live[1]) if live is not None else None
    try:
        with tempfile.TemporaryDirectory(prefix=f"hookrun_{kind}_") as tmp:
            path = Path(tmp) / f"{kind}.h5"
            try:
                run({"data": {"batch_size": batch_size, "inputs": inputs}, "device": str(device), "progress": False,
                     "output": {"path": str(path)}, kind: block}, model=model, dataset=dataset)
            except Interrupted as exc:  # (its line names the temporary file and resume=true: both gone with it)
                raise KeyboardInterrupt(
                    f"hookrun.{kind}: interrupted by {signal.Signals(exc.signum).name}; nothing is kept (the run's "
                    f"temporary file is removed): call hookrun.{kind}(...) again, or give the block to hookrun.run "
                    f"with an output.path for a file that resume=true goes on from") from None
            with h5py.File(path, "r") as f:
                return read(f)
    finally:
        if live is not None:
            live[0].reset(token)
