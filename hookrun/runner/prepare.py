"""prepare(cfg): everything a run needs, built and checked before the output file is touched.

    p = prepare(load(cfg))
    p.model, p.loader, p.points, p.batches   # batches: the range of batch numbers this run covers

The model, dataset, loader, loss and hook plan are built here, and every check that can run
before the first batch does: the device, the output (its destination's checks), the data limits,
early_stop.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from hookrun.config import parse_hooks
from hookrun.config.build import (
    build_dataset,
    build_loss,
    build_model,
    check_dataset,
    live_model,
    weights_digest,
)
from hookrun.config.schema import DTYPES, HookrunConfig, Mode
from hookrun.errors import ConfigError, dataset_label
from hookrun.hooks import HookPoint
from hookrun.hooks.actions import ActionEnv, ModelHold, declares
from hookrun.hooks.plan import make_plan
from hookrun.output import open_destination
from hookrun.runner.calls import CallSpec, first_items, position_limit
from hookrun.runner.kinds import KindContext, check_config, kind_for
from hookrun.runner.loop import LoopSettings, make_loader, one_sample_forward, stored_keys

if TYPE_CHECKING:
    from hookrun.output.interface import Destination


@dataclass
class Prepared:
    """Everything a run needs, built and checked, before the file is touched."""

    cfg: HookrunConfig
    out: Destination  # where the run is written: a local file or object-store parts (output/__init__.py)
    model: torch.nn.Module
    dataset: Any  # the user's map-style dataset
    loader: DataLoader
    points: list[HookPoint]
    env: ActionEnv
    settings: LoopSettings  # settings.batches: the range of batch numbers (a rank's shard narrows it)
    attrs: dict = field(default_factory=dict)  # more root attributes for the file (rank, world_size)

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


def prepare(cfg: HookrunConfig, check_exists: bool = True, model: torch.nn.Module | None = None, dataset: Any = None,
            out: Destination | None = None, hold: ModelHold | None = None) -> Prepared:
    """`model` and `dataset`, where given, are live objects used instead of cfg.model / cfg.data.dataset;
    `out`: the run's destination, made once by run() (default: output.path's); `hold`: the owner of
    what the run attaches to the model (hooks/actions/__init__.py: ModelHold), made by run() before the model is touched."""
    specs = check_alone(cfg)
    mode = cfg.mode
    device = resolve_device(cfg.device)
    kind = kind_for(cfg)
    out = open_destination(cfg) if out is None else out
    out.check_free(cfg.output.overwrite or cfg.resume or not check_exists, cfg.dry_run)  # (a dry run of resume=true: the file is to be there)

    seed_everything(cfg.seed)
    model = build_model(cfg.model, device, cfg.progress) if model is None else live_model(model, device)
    if mode is Mode.grad:
        from hookrun.hooks.grad_hooks import (
            disable_inplace,  # (the gradient hook types' module: mode=grad only)
        )

        disable_inplace(model)
    if mode is Mode.generate and dataset is None:
        # (the generate kind's module: not on a record run's route)
        from hookrun.runner.generation import pad_left

        pad_left(cfg)
    try:  # items that cannot be built, or do not fit the forward: the kind may say what it needs
        dataset = build_dataset(cfg.data.dataset) if dataset is None else check_dataset(dataset, "run(dataset=...): got")
        if len(dataset) == 0:
            raise ConfigError(f"data.dataset: {dataset_label(cfg.data.dataset)!r} is empty")
        spec = CallSpec(*kind.call_inputs(cfg))
        first = first_items(dataset, 1)[0]
        spec.check(first)
        spec.check_forward(model, first)
        table = position_limit(model)
        if table is not None:  # (a model with learned positions: the items' input_ids checked against them)
            from hookrun.runner.token_inputs import check_positions

            check_positions(model, first, table)
            for i, item in enumerate(dataset if isinstance(dataset, list | tuple) else ()):  # held in memory: every item
                check_positions(model, item, table, f"item {i} holds")
    except ConfigError as exc:
        refused = kind.inputs_refused(cfg, model, exc)
        if refused is exc:
            raise
        raise refused from exc
    collate = None
    if cfg.data.collate is not None:  # (run_options.py: loaded where a config gives the option)
        from hookrun.runner.run_options import build_collate

        collate = build_collate(cfg.data.collate)
    loader = make_loader(dataset, cfg.data.batch_size, cfg.data.num_workers, collate=collate)
    if cfg.data.store:  # a key the items lack: refused before the file opens
        stored_keys(loader.collate_fn([(0, first)])[1], tuple(cfg.data.store))
    loss = build_loss(cfg.loss) if cfg.loss is not None and kind.uses_loss else None
    batches = range(len(loader) if cfg.data.limit is None else min(cfg.data.limit, len(loader)))
    planned = np.arange(samples_in(batches, cfg.data.batch_size, len(dataset)))
    env = ActionEnv(store_dtype=DTYPES[cfg.output.dtype.value], planned_samples=planned, hold=hold or ModelHold())
    env.shared["weights_digest"] = digest = weights_digest(model)  # before a splice adds its SAE: a probe op compares it
    try:
        points = make_plan(model, specs, env, mode)
        if cfg.early_stop:
            from hookrun.runner.run_options import check_early_stop

            check_early_stop(points)
        run_kind = kind(KindContext(cfg, model, loader, spec, points, env, loss, device))
    except BaseException:
        env.close()
        raise
    settings = LoopSettings(run_kind, device, batches, cfg.progress, spec=spec, store_keys=tuple(cfg.data.store), positions=table,
                            store_mask=any(getattr(a, "keeps_mask", False) for p in points for a in p.actions))
    try:  # op sites that cannot fire, and splices that do not fit, are refused here: one forward of the first sample
        for a in (a for p in points for a in p.actions):
            a.check_item(dataset[0])  # actions' own look at the first item (a key): no forward needed
        forward = lambda: one_sample_forward(model, loader, settings)  # noqa: E731
        if env.splices:  # the splice check listens to the same forward as the site check
            from hookrun.hooks.splice import check_outputs

            forward = functools.partial(check_outputs, points, forward)
        tensors = tensor_checked(points)
        if tensors:  # so does the actions' check of their tensors (a width, an axis)
            from hookrun.runner.action_state import check_tensors

            forward = functools.partial(check_tensors, tensors, forward)
        if any(p.site is not None for p in points):  # (hooks/site_check.py: loaded for op sites only)
            from hookrun.hooks.site_check import check_sites_run

            points = check_sites_run(points, model, forward)
        elif env.splices or tensors:
            forward()
        out.check_state(env.stateful)
    except BaseException:
        env.close()
        raise
    return Prepared(cfg, out, model, dataset, loader, points, env, settings,
                    attrs={"model_fingerprint": weights_digest(model) if env.splices else digest, **input_normalize(dataset)})


def check_alone(cfg: HookrunConfig) -> list:
    """The checks of `cfg` that need no model, data, device or file: its imports, the hook specs, the
    options' table and the kind's block, the patch source; the specs back. A sweep runs them for every
    job before its first job starts (cli/sweep_checks.py)."""
    if cfg.imports:  # (config/plugins.py: a module of imports: may register a kind)
        from hookrun.config.plugins import import_modules

        import_modules(cfg.imports)
    specs = parse_hooks(cfg.hooks)
    check_config(cfg)  # the common table, then the kind's own check
    check_not_a_patch_source(specs, cfg.output.path)
    return specs


def input_normalize(dataset: Any) -> dict:
    """{"input_normalize": JSON {mean, std}} where the data set's transform normalises its images (a
    torchvision Normalize): the pictures undo it exactly (analysis/images.py); {} otherwise."""
    import json

    from hookrun.data import normalization

    norm = normalization(dataset)
    return {"input_normalize": json.dumps(norm)} if norm else {}


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def tensor_checked(points: list[HookPoint]) -> list[tuple[HookPoint, Any]]:
    """The (point, action) pairs whose action checks its tensor in one sample's forward (record: only with a select)."""
    return [(p, a) for p in points for a in p.actions
            if p.site is None and p.type in ("forward", "forward_pre") and declares(a, "check_tensor")
            and getattr(a, "checks_tensor", True)]
