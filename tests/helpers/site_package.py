"""A user's package as `pip install` leaves it: one module in a site folder and its dist-info folder
declaring entry points, for tests that run hookrun in a subprocess with that folder on PYTHONPATH; and
the same module imported in the test's own process (the references: its model called directly).

    site = install(tmp_path / "site", "swkind", KIND, "[hookrun.kinds]\\nswkind = swkind:KIND\\n")
    with imported(site, "swkind") as pkg:
        sums = pkg.tiny().eval()(pkg.data().tensors[0])
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]

# a tiny model and its data set, for a package module's text (its own imports: torch)
TINY_MODEL_AND_DATA = '''
    def tiny():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))

    def data():
        return torch.utils.data.TensorDataset(torch.randn(6, 4, generator=torch.Generator().manual_seed(1)))
'''


def scaled_kind(name: str, fields: str = "", rest: str = 'KIND = KindPlugin("NAME", block=Block, run=Scaled)') -> str:
    """A package module's text: the kind NAME whose block is `factor` (and `fields`, a Block line such as
    'label: str = "sum"'), whose run keeps each item's model output x factor, summed (`captures/NAME/__model__/sum`),
    then `rest` (its KIND, by default) and the tiny model and data; every "NAME" is `name`."""
    return ("""
    from dataclasses import dataclass

    import torch
    from hookrun.config.plugins import KindPlugin
    from hookrun.runner.kinds import NOTHING, RunKind, plain_forward
    from hookrun.store.records import Capture, CaptureKey

    @dataclass
    class Block:
        factor: float = 1.0
        FIELDS

    class Scaled(RunKind):
        def step(self, model, call, session):
            out = plain_forward(model, call) * self.ctx.cfg.NAME.factor
            self.ctx.env.captures.add(Capture(CaptureKey("NAME", "", "NAME", "sum"), out.sum(1), False,
                                              dims=("sample",)))
            return NOTHING

    REST
    """.replace("FIELDS", fields).replace("REST", rest) + TINY_MODEL_AND_DATA).replace("NAME", name)


def install(site: Path, name: str, module: str, entry_points: str) -> Path:
    """`site`/NAME.py from `module` (dedented) and NAME-0.1.dist-info with `entry_points` (entry_points.txt's text)."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (site / f"{name}.py").write_text(textwrap.dedent(module))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site


def site_env(site: Path, **extra: str) -> dict[str, str]:
    """The subprocess's environment: `site` and the repository on PYTHONPATH, one thread, `extra` set."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1", **extra}


@contextmanager
def imported(site: Path, name: str) -> Iterator[ModuleType]:
    """The package's module imported here, dropped again (sys.path and sys.modules) after the block."""
    sys.path.insert(0, str(site))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(site))
        sys.modules.pop(name, None)
