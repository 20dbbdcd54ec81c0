"""A multirun's folder: one an earlier sweep of other overrides wrote is refused before Hydra rewrites
its multirun.yaml (cli/app.py asks, for `-m` only).

    python -m hookrun -m params.f=0,1 hydra.sweep.dir=sweeps/s7     # ... then again with params.f=5,6:
    hookrun: error: hydra.sweep.dir=sweeps/s7: an earlier sweep of other overrides is there (params.f=0,1) ...

`output.overwrite=true` runs another sweep in it (the readers leave out the earlier sweep's job
folders the new multirun.yaml does not plan); `resume=true` resumes the sweep that is there, so its
overrides must be the same, run-control keys (resume, progress, output.overwrite, output.flush_every)
left out of the comparison.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from hookrun.errors import ConfigError

OVERWRITE = re.compile(r"^\+*output\.overwrite=(true|True|yes|1)$")  # runs another sweep in an earlier sweep's folder
RESUME = re.compile(r"^\+*resume=(true|True|yes|1)$")  # goes on with the sweep that is there


def check_sweep_folder(args: list[str]) -> None:
    """`-m ... hydra.sweep.dir=X` where an earlier sweep of other overrides ran: each job would be refused
    ("exists"), but Hydra rewrites X/multirun.yaml first, and that sweep's record then lists the new
    sweep's jobs as its own. Checked before Hydra starts (an exception in a Hydra callback is only a warning)."""
    dirs = [a.partition("=")[2] for a in args if a.startswith("hydra.sweep.dir=")]
    if not dirs or not (Path(dirs[-1]) / "multirun.yaml").is_file():
        return
    folder = Path(dirs[-1])
    task = [a for a in args if not a.startswith(("-", "hydra.", "hydra/", "+hydra", "~hydra"))]
    if any(OVERWRITE.match(t) for t in task) and not any(RESUME.match(t) for t in task):
        return
    try:
        earlier = yaml.safe_load((folder / "multirun.yaml").read_text()) or {}
        before = [str(t) for t in earlier["hydra"]["overrides"]["task"] or []]
    except (yaml.YAMLError, OSError, KeyError, TypeError):
        before = None
    if any(RESUME.match(t) for t in task):
        if before is None or sorted(_what(before)) != sorted(_what(task)):
            raise ConfigError(f"hydra.sweep.dir={folder}: resume=true goes on with the sweep there "
                              f"({' '.join(_what(before)) if before is not None else 'its multirun.yaml is unreadable'}), "
                              f"not one of other overrides ({' '.join(_what(task))}); give its overrides, another "
                              f"hydra.sweep.dir, or output.overwrite=true to run this sweep in it")
        return
    if before != task:
        raise ConfigError(f"hydra.sweep.dir={folder}: an earlier sweep of other overrides is there "
                          f"({' '.join(before) if before else 'its multirun.yaml'}); give another hydra.sweep.dir, "
                          f"or resume=true or output.overwrite=true to run this sweep in it")


def _what(overrides: list[str]) -> list[str]:
    """A sweep's task overrides without the run-control keys (how its jobs run, not what they compute)."""
    from hookrun.analysis.sweep_plan import RUN_CONTROL

    return [o for o in overrides if o.partition("=")[0].lstrip("+~") not in RUN_CONTROL]

