"""`python -m hookrun.modules [OVERRIDES] [--match GLOB]`: the modules `at:` can name.

    python -m hookrun.modules model=resnet50
    python -m hookrun.modules model=resnet18 --match 'layer1.**'

The model and the dataset are composed from the same config as `python -m hookrun` (any model=,
data=, experiment= or key=value override); one item of the dataset goes through the model so
that each module shows its input and output shapes and how often it runs per forward.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

import torch

from hookrun.capture.lister import ModuleTable, list_modules
from hookrun.cli.app import compose_config
from hookrun.config.build import build_dataset, build_model, import_modules
from hookrun.config.schema import load
from hookrun.errors import ConfigError, HookrunError
from hookrun.runner.batches import check_item, make_loader, split_batch
from hookrun.runner.prepare import resolve_device, seed_everything


def modules_of_config(overrides: list[str], match: str | None = None, example: bool = True) -> ModuleTable:
    """The module table of the model `python -m hookrun OVERRIDES` would build."""
    cfg = load(compose_config(overrides))
    import_modules(cfg.imports)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, device)
    return list_modules(model, first_input(cfg.data.dataset, device) if example else None, match)


def first_input(node: Mapping, device: torch.device) -> Any:
    """The first item of the dataset, collated as a batch of one, as the run's loop feeds it."""
    dataset = build_dataset(node)
    if len(dataset) == 0:
        raise ConfigError(f"data.dataset: {node['_target_']!r} is empty")
    check_item(dataset[0])
    _, batch = next(iter(make_loader(dataset, 1, 0)))
    inputs, _ = split_batch(batch)
    if isinstance(inputs, Mapping):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return inputs.to(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.modules", description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="config overrides, as for python -m hookrun (model=resnet50, data=...)")
    p.add_argument("--match", help="list only what this module name or glob selects (as hooks.NAME.at would)")
    p.add_argument("--no-example", action="store_true", help="skip the forward of one example (no shapes, no calls)")
    a = p.parse_args(argv)
    try:
        table = modules_of_config(a.overrides, a.match, example=not a.no_example)
    except HookrunError as exc:
        print(f"hookrun: error: {exc}", file=sys.stderr)
        return 2
    print(table)
    print(f"{len(table)} module(s); hooks.NAME.at takes these names, or globs of them "
          f"(`*` within one dotted part, `**` across parts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
