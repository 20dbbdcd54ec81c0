"""run(cfg): the whole capture run, from a validated config to a complete HDF5 file.

    from hookrun import run
    result = run({"model": {...}, "data": {...}, "hooks": {...}, "output": {"path": "x.h5"}})

Hydra-free: the CLI composes the config and calls this; tests and notebooks call it directly.
Everything that can be checked is checked before the first batch.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun import __version__
from hookrun.actions import ActionEnv
from hookrun.actions.record import Record
from hookrun.build import build_dataset, build_loss, build_model, import_modules
from hookrun.config import HookrunConfig, load, to_yaml
from hookrun.data import check_item, make_loader
from hookrun.errors import ConfigError
from hookrun.loop import LoopSettings, run_batches
from hookrun.plan import make_plan
from hookrun.session import HookSession
from hookrun.spec import parse_hooks
from hookrun.store import H5Store
from hookrun.writer import BackgroundWriter

log = logging.getLogger("hookrun")

STORE_DTYPES = {"keep": None, "float16": torch.float16, "float32": torch.float32}


@dataclass
class RunResult:
    path: Path
    steps: int
    samples: int
    seconds: float


def run(cfg: Any) -> RunResult:
    cfg = load(cfg)
    started = time.perf_counter()
    import_modules(cfg.imports)
    specs = parse_hooks(cfg.hooks)
    mode = cfg.mode.value
    device = resolve_device(cfg.device)
    if mode == "grad" and cfg.loss is None:
        raise ConfigError("mode=grad needs a loss: add loss=cross_entropy, loss=sum, loss=target_logit or loss=custom")
    if cfg.data.limit is not None and cfg.data.limit < 1:
        raise ConfigError(f"data.limit must be at least 1 (or null for all batches), got {cfg.data.limit}")
    out = check_output(cfg.output.path, cfg.output.overwrite)

    seed_everything(cfg.seed)
    model = build_model(cfg.model, device)
    if mode == "grad":
        disable_inplace(model)
    dataset = build_dataset(cfg.data.dataset)
    if len(dataset) == 0:
        raise ConfigError(f"data.dataset: {cfg.data.dataset['_target_']!r} is empty")
    check_item(dataset[0])
    loader = make_loader(dataset, cfg.data.batch_size, cfg.data.num_workers)
    loss = build_loss(cfg.loss) if mode == "grad" else None
    n_batches = len(loader) if cfg.data.limit is None else min(cfg.data.limit, len(loader))
    planned = np.arange(min(len(dataset), n_batches * cfg.data.batch_size))
    env = ActionEnv(store_dtype=STORE_DTYPES[cfg.output.dtype.value], planned_samples=planned)
    try:
        points = make_plan(model, specs, env, mode)
    except BaseException:
        env.close()
        raise
    log.info("%s on %s, %d hook point(s), writing %s", type(model).__name__, device, len(points), out)
    if cfg.early_stop:
        check_early_stop(points, mode)
    if not any(isinstance(a, Record) for p in points for a in p.actions):
        log.warning("no hook records anything: the file will hold the sample index and targets only")

    store = H5Store(out, file_attrs(cfg, model, device), cfg.output.compression.value)
    settings = LoopSettings(mode, device, loss, cfg.data.limit, cfg.progress)
    status = "failed"
    try:
        with HookSession(points, env, cfg.early_stop) as session, BackgroundWriter(store) as writer:
            steps = run_batches(model, loader, session, writer, env, settings)
        status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        samples = store.samples
        store.close(status)
        env.close()
    seconds = time.perf_counter() - started
    log.info("%s: %d batches, %d samples, %.1f MB in %.1f s", status, steps, samples, out.stat().st_size / 1e6, seconds)
    return RunResult(out, steps, samples, seconds)


def check_early_stop(points: list, mode: str) -> None:
    if mode != "eval":
        raise ConfigError("early_stop=true needs mode=eval: a backward pass needs the whole forward")
    for p in points:
        if p.type not in ("forward", "forward_pre") or not all(isinstance(a, Record) for a in p.actions):
            raise ConfigError(
                f"early_stop=true needs hooks that only record (forward or forward_pre with record actions); "
                f"hooks.{p.hook} is type {p.type} with {[type(a).__name__ for a in p.actions]}"
            )


def resolve_device(name: str) -> torch.device:
    name = str(name).strip()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: {name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={name}: CUDA is not available on this machine; use device=cpu or device=auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device={name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={name}: MPS is not available on this machine; use device=cpu or device=auto")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device: {name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


def check_output(path: str, overwrite: bool) -> Path:
    out = Path(path).expanduser()
    if out.exists() and not overwrite:
        raise ConfigError(f"output.path: {str(out)!r} exists; set output.overwrite=true or choose another path")
    if out.is_dir():
        raise ConfigError(f"output.path: {str(out)!r} is a folder; give a file path such as captures.h5")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"output.path: cannot create the folder {str(out.parent)!r}: {exc.strerror}") from None
    if not os.access(out.parent, os.W_OK):
        raise ConfigError(f"output.path: the folder {str(out.parent)!r} is not writable")
    return out


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def disable_inplace(model: torch.nn.Module) -> None:
    """Turn off `inplace=True` (ReLU and friends): the numbers are the same, and full backward
    hooks cannot follow a tensor that a later module overwrites."""
    for module in model.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False


def file_attrs(cfg: HookrunConfig, model: torch.nn.Module, device: torch.device) -> dict:
    return {
        "config": to_yaml(cfg),
        "hookrun_version": __version__,
        "torch_version": torch.__version__,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "device": str(device),
        "mode": cfg.mode.value,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
