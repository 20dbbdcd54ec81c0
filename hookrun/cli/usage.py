"""hookrun's own `--help` and `--version` text (Hydra's config groups and config follow the help).

    print(usage(conf_dir()))   # what hookrun does, its commands, an example, where the config reference is
    print(version())   # hookrun 0.2.0 (torch 2.x, Python 3.x)

The command list names only the entry points this install has, so the help never points at a
command that is not there; the kinds of run are those the plugin registry finds (hookrun's own
folders and a user's package's entry points), each with its summary and the experiments that give
its block, so the help names no kind by hand.
"""

from __future__ import annotations

import importlib.util
import platform
import textwrap

COMMANDS = (  # (module run as python -m MODULE, what it does)
    ("hookrun", "run hooks over a dataset and write what they record to HDF5 (this command)"),
    ("hookrun.modules", "list the modules and op sites `at:` can name, with shapes (--match GLOB, --ops)"),
    ("hookrun.inspect", "summarise a run's file or a sweep folder (--verify checks every row's checksum)"),
    ("hookrun.plot", "plot a run's captures and what its kind adds"),
    ("hookrun.report", "an HTML report of a run or a sweep"),
    ("hookrun.circuits", "a circuit's scores to EAP-IG's or MIB's files (export); a circuit file's CPR, CMD (score)"),
)


def commands() -> list[tuple[str, str]]:
    """The COMMANDS this install has."""
    out = []
    for module, what in COMMANDS:
        try:
            there = module == "hookrun" or importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            there = False
        if there:
            out.append((module, what))
    return out


def kinds(conf: str) -> list[tuple[str, str, list[str]]]:
    """(name, summary, the experiments of `conf`/experiment/ whose file gives its block) for every kind
    plugin this install finds: hookrun's folders and a user's entry points (docs/architecture.md)."""
    from hookrun.cli.override_faults import experiments_with
    from hookrun.config.plugins import plugin
    from hookrun.config.schema import REFUSED, plugin_names

    out = []
    for name in plugin_names():
        try:
            summary = plugin(name).summary
        except Exception as exc:  # a user's plugin that fails to load is listed with why
            summary = f"(fails to load: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        out.append((name, summary, experiments_with(name, conf)))
    return out + [(name, f"({why})", []) for name, why in sorted(REFUSED.items())]


def usage(conf: str) -> str:
    """The help; `conf`: hookrun's conf/ folder (cli/app.py's conf_dir), whose experiments it names."""
    listed_commands = commands()  # (find_spec per command: asked once)
    width = max(len(m) for m, _ in listed_commands) + len("python -m ")
    listed = kinds(conf)
    named = max((len(n) for n, _, _ in listed), default=0)
    entries = [textwrap.fill(f"{n:<{named}}  {summary}" + (f" (experiment={', '.join(e)})" if e else ""), 100,
                             initial_indent="  ", subsequent_indent=" " * (named + 4), break_on_hyphens=False)
               for n, summary, e in listed]
    lines = [
        "hookrun: declarative PyTorch hooks. A config names a model, a dataset and hooks (a module path or",
        "glob, a hook type, actions: record, modify_output, ...); hookrun runs the data through the model",
        "and writes what the hooks record to one HDF5 file (hookrun.capture does the same in a notebook).",
        "",
        "Commands:",
        *(f"  {'python -m ' + m:<{width}}  {what}" for m, what in listed_commands),
        "",
        "Example:",
        "  python -m hookrun experiment=resnet_layer1          # record layer1's outputs of a ResNet-18",
        "  python -m hookrun model=tiny_lm data=text 'hooks={attn: {at: transformer.h.0.attn, type: forward}}'",
        "",
        "Kinds of run: a block named as the kind turns one on (the experiments that give the block):",
        *entries,
        "A block the config has takes KEY=VALUE (KIND.KEY=VALUE); one it has not is added with a +:",
        "'+KIND={KEY: VALUE, ...}'. A package of your own adds a kind (docs/architecture.md, a plugin).",
        "",
        "Every config key is described in docs/config.md (the config reference);",
        "python -m hookrun --version prints hookrun's version; --verbose shows tracebacks.",
        "",
    ]
    return "\n".join(lines)


def version() -> str:
    from hookrun.store import HOOKRUN_VERSION

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = "not installed"
    return f"hookrun {HOOKRUN_VERSION} (torch {torch_version}, Python {platform.python_version()})"
