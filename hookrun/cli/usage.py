"""hookrun's own `--help` and `--version` text (Hydra's config groups and config follow the help).

    print(usage())     # what hookrun does, its commands, an example, where the config reference is
    print(version())   # hookrun 0.2.0 (torch 2.x, Python 3.x)

The command list names only the entry points this install has, so the help never points at a
command that is not there.
"""

from __future__ import annotations

import importlib.util
import platform

COMMANDS = (  # (module run as python -m MODULE, what it does)
    ("hookrun", "run hooks over a dataset and write what they record to HDF5 (this command)"),
    ("hookrun.modules", "list the modules and op sites `at:` can name, with shapes (--match GLOB, --ops)"),
    ("hookrun.inspect", "summarise a run's file or a sweep folder (--verify checks every row's checksum)"),
    ("hookrun.plot", "plot a run's captures and what its kind adds"),
    ("hookrun.report", "an HTML report of a run"),
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


def usage() -> str:
    width = max(len(m) for m, _ in commands()) + len("python -m ")
    lines = [
        "hookrun: declarative PyTorch hooks. A config names a model, a dataset and hooks (a module path or",
        "glob, a hook type, actions: record, modify_output, ...); hookrun runs the data through the model",
        "and writes what the hooks record to one HDF5 file (hookrun.capture does the same in a notebook).",
        "",
        "Commands:",
        *(f"  {'python -m ' + m:<{width}}  {what}" for m, what in commands()),
        "",
        "Example:",
        "  python -m hookrun experiment=resnet_layer1          # record layer1's outputs of a ResNet-18",
        "  python -m hookrun model=tiny_lm data=text 'hooks={attn: {at: transformer.h.0.attn, type: forward}}'",
        "  python -m hookrun model=tiny_cnn data=shapes '+attribution={method: saliency}'   # add a kind's block",
        "",
        "A kind's block the config has takes KEY=VALUE (attribution.method=saliency); one it has not is added",
        "with a +: '+patching={method: eap, ...}', '+attribution={method: saliency, ...}' (or pick an experiment",
        "that has it: experiment=edges, experiment=attribution_shapes).",
        "",
        "Every config key is described in docs/config.md (the config reference);",
        "python -m hookrun --version prints hookrun's version; --verbose shows tracebacks.",
        "",
    ]
    return "\n".join(lines)


def version() -> str:
    from hookrun.store.format import HOOKRUN_VERSION

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = "not installed"
    return f"hookrun {HOOKRUN_VERSION} (torch {torch_version}, Python {platform.python_version()})"
