"""`python -m hookrun.modules [OVERRIDES] [--match GLOB] [--ops]`: the modules (and op sites) `at:` can name.

    python -m hookrun.modules model=resnet50
    python -m hookrun.modules model=resnet18 --match 'layer1.**'
    python -m hookrun.modules model=hf data=text --ops --match 'transformer.h.0.attn'   # its op sites too
    python -m hookrun.modules model=hf data=text --match 'transformer.h.*.attn/softmax'  # just those sites

The model and the dataset are composed from the same config as `python -m hookrun` (any model=,
data=, experiment= or key=value override); one item of the dataset goes through the model so
that each module shows its input and output shapes and how often it runs per forward. A shipped
model named without data= (model=tiny_cnn, tiny_lm, hf) reads its own data for that item (data=shapes,
data=text); an item the model cannot take is one line naming data= and --no-example.
"""

from __future__ import annotations

import argparse

import torch

from hookrun.cli import description, ends_quietly, exit_process, fail, run_command
from hookrun.cli.compose import compose_config
from hookrun.config import load
from hookrun.config.build import build, build_dataset, build_model
from hookrun.config.plugins import import_modules
from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError, RunError
from hookrun.notebook.lister import ModuleTable, list_modules
from hookrun.runner.calls import CallSpec, ModelCall
from hookrun.runner.extra_forwards import first_batch
from hookrun.runner.loop import make_loader
from hookrun.runner.prepare import resolve_device, seed_everything

MODEL_DATA = {"tiny_cnn": "shapes", "tiny_lm": "text", "hf": "text"}  # the shipped models' own data (conf/data)


def modules_of_config(overrides: list[str], match: str | None = None, example: bool = True, ops: bool = False) -> ModuleTable:
    """The module table of the model `python -m hookrun OVERRIDES` would build (with its op sites: ops).
    A shipped model named without data= or experiment= gets its own data for the example (MODEL_DATA:
    model=tiny_cnn's 1 x 32 x 32 shapes, not the default data's 3 x 224 x 224 images), said in one line."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("model=")]
    own = MODEL_DATA.get(chosen[-1]) if chosen and not any(o.startswith(("data=", "experiment=", "+experiment=")) for o in overrides) else None
    if own and example:
        print(f"example: data={own}, model={chosen[-1]}'s own data (give data=... for another)")
        overrides = [*overrides, f"data={own}"]
    cfg = load(compose_config(overrides))
    import_modules(cfg.imports)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, device)
    call = first_call(cfg, device) if example else None
    try:
        return list_modules(model, call, match, ops=ops)
    except RunError as exc:
        if call is None or "the model's forward failed" not in str(exc):
            raise
        raise ConfigError(f"{exc}; the example is the first item of data.dataset ({cfg.data.dataset.get('_target_')}: "
                          f"{call.describe()}): give the model's own data (data=..., e.g. data=shapes for model=tiny_cnn, "
                          "data=text for a language model), or list the modules without it: --no-example") from None


def first_call(cfg: HookrunConfig, device: torch.device) -> ModelCall:
    """The forward call of the dataset's first item, as a batch of one, as the run's loop makes it."""
    dataset = build_dataset(cfg.data.dataset)
    if len(dataset) == 0:
        raise ConfigError(f"data.dataset: {cfg.data.dataset['_target_']!r} is empty")
    spec = CallSpec(cfg.data.inputs, cfg.data.target)
    spec.check(dataset[0])
    collate = build(cfg.data.collate, "data.collate") if cfg.data.collate is not None else None
    return first_batch(make_loader(dataset, 1, 0, collate=collate), spec)[1].to(device)


@ends_quietly
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.modules", description=description(__doc__))
    p.add_argument("overrides", nargs="*", help="config overrides, as for python -m hookrun (model=resnet50, data=...)")
    p.add_argument("--match", help="list only what this module name or glob selects (as hooks.NAME.at would)")
    p.add_argument("--ops", action="store_true", help="under each module, the op sites (MODULE/FN.k) its own forward "
                   "calls, in call order, with their shapes")
    p.add_argument("--no-example", action="store_true", help="skip the forward of one example (no shapes, no calls)")
    a = p.parse_args(argv)
    if a.ops and a.no_example:
        return fail("--ops needs the example's forward (op sites are found by running it); drop --no-example")
    return run_command(lambda: _modules(a))


def _modules(a: argparse.Namespace) -> int:
    table = modules_of_config(a.overrides, a.match, example=not a.no_example, ops=a.ops)
    print(table)
    sites, modules = len(table.ops()), len(table) - len(table.ops())
    counts = ([f"{modules} module(s)"] if modules or not sites else []) + ([f"{sites} op site(s)"] if sites else [])
    print(", ".join(counts) + "; hooks.NAME.at takes these "
          "names, or globs of them (`*` within one dotted part, `**` across parts; MODULE/FN: every call of FN)")
    return 0


if __name__ == "__main__":
    exit_process(main)
