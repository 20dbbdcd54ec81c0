"""Hydra's first compose, skipped where it cannot change anything (issue 41 item 18).

Hydra 1.3 composes the whole config twice for every command: `Hydra.get_mode` composes it only to
read `hydra.mode` (a config may set `hydra: {mode: MULTIRUN}` to sweep without `-m`), then the run
composes it again. That first compose is about 0.2 s of every run's start (cProfile of
`python -m hookrun experiment=resnet_layer1`; benchmarks/process_pair.py times the whole process).

    with skip_mode_compose(sys.argv[1:], conf_dir()):
        app()

The compose is skipped, and the mode left to the command line (`-m` or not, as Hydra does when a
config sets no mode), only where nothing can set `hydra.mode`: no argument names it or adds a config
folder (`--config-dir`, `--config-path`, `--config-name`, `hydra.searchpath`, `hydra.mode`), and
no YAML file in hookrun's config folder sets `mode: RUN` or `mode: MULTIRUN` or a search path.
Anywhere else Hydra's own get_mode runs, unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SETS_MODE = re.compile(r"^\s*(hydra\.)?mode:\s*['\"]?(MULTIRUN|RUN)\b|searchpath", re.MULTILINE)
ARGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "hydra.mode", "+hydra.mode",
        "++hydra.mode", "hydra.searchpath", "+hydra.searchpath", "++hydra.searchpath")


def mode_is_the_command_lines(args: list[str], conf: str | Path) -> bool:
    """Whether no argument and no config file of `conf` can set hydra.mode."""
    if any(a.split("=", 1)[0] in ARGS for a in args):
        return False
    return not any(SETS_MODE.search(p.read_text(errors="replace")) for p in Path(conf).rglob("*.yaml"))


@contextmanager
def skip_mode_compose(args: list[str], conf: str | Path) -> Iterator[bool]:
    """Within: Hydra's get_mode answers None (the command line decides) where no config can set the mode."""
    from hydra._internal.hydra import Hydra

    skip = mode_is_the_command_lines(args, conf)
    original = Hydra.get_mode
    if skip:
        Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield skip
    finally:
        Hydra.get_mode = original
