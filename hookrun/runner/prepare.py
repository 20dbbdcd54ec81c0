"""prepare(cfg): everything a run needs, built and checked before the output file is touched.

    p = prepare(load(cfg))
    p.model, p.loader, p.points, p.batches   # batches: the range of batch numbers this run covers

The model, dataset, loader, loss and hook plan are built here, and every check that can run
before the first batch does: the device, the output path, the data limits, early_stop.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun.config.build import (
    build,
    build_dataset,
    build_loss,
    build_model,
    check_dataset,
    import_modules,
    live_model,
)
from hookrun.config.schema import DTYPES, HookrunConfig
from hookrun.config.specs import parse_hooks
from hookrun.errors import ConfigError
from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.plan import make_plan
from hookrun.hooks.points import HookPoint
from hookrun.hooks.site_check import check_sites_run
from hookrun.hooks.splice import check_outputs
from hookrun.runner.action_state import check_actions
from hookrun.runner.batches import make_loader
from hookrun.runner.calls import CallSpec
from hookrun.runner.evaluate import build_evaluator
from hookrun.runner.generate import check_modes, pad_left, prepare_generation
from hookrun.runner.loop import LoopSettings, one_sample_forward
from hookrun.store.h5file import flushing_path, writable_folder
from hookrun.store.parts import Output
from hookrun.store.remote import is_url


@dataclass
class Prepared:
    """Everything a run needs, built and checked, before the file is touched."""

    cfg: HookrunConfig
    out: Path | Output  # Output: an object-store path (store/parts.py)
    model: torch.nn.Module
    dataset: Any
    loader: Any
    points: list[HookPoint]
    env: ActionEnv
    settings: LoopSettings  # settings.batches: the range of batch numbers (a rank's shard narrows it)
    attrs: dict = field(default_factory=dict)  # more root attributes for the file (rank, world_size)
    patching: Any = None  # a patching run's engine, set up (runner/kinds/patching.py's PatchRun)

    @property
    def batches(self) -> range:
        return self.settings.batches

    @property
    def n_batches(self) -> int:
        return len(self.settings.batches)

    @property
    def n_samples(self) -> int:
        """The samples of this run's batches (the last batch may be short)."""
        return samples_in(self.settings.batches, self.cfg.data.batch_size, len(self.dataset))


def prepare(cfg: HookrunConfig, check_exists: bool = True, model: Any = None, dataset: Any = None) -> Prepared:
    """`model` and `dataset`, where given, are live objects used instead of cfg.model / cfg.data.dataset."""
    import_modules(cfg.imports)
    specs = parse_hooks(cfg.hooks)
    mode = cfg.mode.value
    device = resolve_device(cfg.device)
    if mode == "grad" and cfg.loss is None:
        raise ConfigError("mode=grad needs a loss: add loss=cross_entropy, loss=lm (a language model's next-token loss), "
                          "loss=sum, loss=target_logit or loss=custom")
    if cfg.data.limit is not None and cfg.data.limit < 1:
        raise ConfigError(f"data.limit must be at least 1 (or null for all batches), got {cfg.data.limit}")
    if cfg.output.flush_every is not None and cfg.output.flush_every < 1:
        raise ConfigError(f"output.flush_every must be at least 1 (or null: every 2 seconds), got {cfg.output.flush_every}")
    if cfg.data.batch_size > sys.maxsize:  # (below 1: make_loader says so)
        raise ConfigError(f"data.batch_size must be at least 1 and at most {sys.maxsize}, got {cfg.data.batch_size}")
    if not -(2**63) <= cfg.seed < 2**64:
        raise ConfigError(f"seed: {cfg.seed} is out of range; use a whole number from 0 to {2**64 - 1} (2**64 - 1)")
    check_not_a_patch_source(specs, cfg.output.path)
    if is_url(cfg.output.path):  # an object store: checked (reachable, not taken) by the runner before this
        out = Output.of(cfg.output.path, cfg.output.staging)
    else:
        out = check_output(cfg.output.path, cfg.output.overwrite or not check_exists, create=not cfg.dry_run)

    seed_everything(cfg.seed)
    model = build_model(cfg.model, device) if model is None else live_model(model, device)
    if mode == "grad":
        disable_inplace(model)
    if mode == "generate" and dataset is None:
        pad_left(cfg)
    dataset = build_dataset(cfg.data.dataset) if dataset is None else check_dataset(dataset, "run(dataset=...): got")
    if len(dataset) == 0:
        raise ConfigError(f"data.dataset: {dataset_name(cfg)!r} is empty")
    spec = CallSpec(cfg.data.inputs, cfg.data.target)
    spec.check(dataset[0])
    spec.check_forward(model, dataset[0])
    collate = build(cfg.data.collate, "data.collate") if cfg.data.collate is not None else None
    if collate is not None and not callable(collate):
        raise ConfigError(f"data.collate: built a {type(collate).__name__}, not a function (add `_partial_: true`)")
    loader = make_loader(dataset, cfg.data.batch_size, cfg.data.num_workers, collate=collate)
    evaluating = cfg.evaluate is not None and cfg.evaluate.enabled
    loss = build_loss(cfg.loss) if mode == "grad" or evaluating else None
    batches = range(len(loader) if cfg.data.limit is None else min(cfg.data.limit, len(loader)))
    planned = np.arange(samples_in(batches, cfg.data.batch_size, len(dataset)))
    env = ActionEnv(store_dtype=DTYPES[cfg.output.dtype.value], planned_samples=planned)
    try:
        points = make_plan(model, specs, env, mode)
        evaluator = build_evaluator(cfg, loss, points, env)
        if cfg.early_stop and mode != "generate":
            check_early_stop(points, mode)
        generation = prepare_generation(cfg, model, loader, spec, points, env.state) if mode == "generate" else None
        if mode != "generate":
            check_modes(points, mode)
    except BaseException:
        env.close()
        raise
    settings = LoopSettings(mode, device, loss, batches, cfg.progress, spec=spec, store_keys=tuple(cfg.data.store),
                            generation=generation, evaluator=evaluator)
    try:  # op sites that cannot fire, and splices that do not fit, are refused here: one forward of the first sample
        forward = lambda: one_sample_forward(model, loader, settings)  # noqa: E731
        if env.splices:  # the splice check listens to the same forward as the site check
            forward = functools.partial(check_outputs, points, forward)
        if any(p.site is not None for p in points):
            points = check_sites_run(points, model, forward)
        elif env.splices:
            forward()
        # actions' own checks (an item key, a tensor's width or axes): one line before any batch
        check_actions(points, dataset[0], lambda: one_sample_forward(model, loader, settings))
        if env.stateful and is_url(cfg.output.path):
            raise ConfigError(f"{env.stateful[0].where}: {type(env.stateful[0]).__name__} keeps a state over the run, "
                              f"which an object-store output does not save yet; write to a local file")
    except BaseException:
        env.close()
        raise
    return Prepared(cfg, out, model, dataset, loader, points, env, settings)


def samples_in(batches: range, batch_size: int, dataset_size: int) -> int:
    """How many samples the batches `batches` hold (the dataset's last batch may be short)."""
    if not len(batches):
        return 0
    return max(0, min(dataset_size, batches.stop * batch_size) - batches.start * batch_size)


def check_not_a_patch_source(specs: list, output: str) -> None:
    """A run must not write the file it patches from: output.overwrite would truncate the clean
    run while it is read. Refused before anything is opened."""
    out = Path(output).expanduser().resolve()
    for spec in specs:
        for action in spec.actions:
            source = action.params.get("source") if action.params.get("op") == "patch" else None
            if isinstance(source, str) and source and Path(source).expanduser().resolve() == out:
                raise ConfigError(f"output.path {output!r} is the patch source of hooks.{spec.name} "
                                  f"({action.where}.source): the run would overwrite the file it reads; "
                                  f"write the patched run to another output.path")


def dataset_name(cfg: HookrunConfig) -> str:
    node = cfg.data.dataset
    return str(node.get("_target_", node.get("live", "?"))) if isinstance(node, dict) else str(node)


def check_early_stop(points: list, mode: str) -> None:
    if mode != "eval":
        raise ConfigError("early_stop=true needs mode=eval: a backward pass needs the whole forward")
    for p in points:
        if p.type not in ("forward", "forward_pre") or not all(a.records and not a.modifies for a in p.actions):
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


def check_output(path: str | Path, overwrite: bool, create: bool = True) -> Path:
    out = Path(path).expanduser()
    try:
        if out.is_dir():
            raise ConfigError(f"output.path: {str(out)!r} is a folder; give a file path such as captures.h5")
        exists = out.exists()
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES on a parent ...
        raise ConfigError(f"output.path: {_os_reason(out, exc)}") from None
    room = _name_max(out) - len(".creating") - 24  # beside it: .<name>.<pid>.creating, <name>.resuming, <name>.lock
    if len(out.name.encode()) > room:
        raise ConfigError(f"output.path: the file name {out.name[:40]!r}... is too long ({len(out.name.encode())} bytes; "
                          f"hookrun needs it under {room + 1} bytes, to add .lock or .resuming): choose a shorter output.path")
    if exists and not overwrite:
        raise ConfigError(f"output.path: {str(out)!r} exists; set output.overwrite=true, resume=true, or choose another path")
    if not exists and not overwrite and flushing_path(out).exists():
        raise ConfigError(f"output.path: {str(flushing_path(out))!r} is what a run killed while flushing {out.name} left; "
                          f"resume=true recovers its batches, output.overwrite=true starts again, or choose another path")
    if not create:
        return out
    writable_folder(out.parent, "output.path")
    return out


def _os_reason(out: Path, exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        longest = max(out.parts, key=len)
        return (f"the name {longest[:40]!r}... is too long ({len(longest.encode())} bytes; file systems allow "
                f"{_name_max(out)} bytes in a name): choose a shorter output.path")
    return f"{str(out)[:200]!r} cannot be used: {exc.strerror or exc}"


def _name_max(out: Path) -> int:
    folder = next((p for p in [out.parent, *out.parents] if p.exists()), Path("."))
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


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
