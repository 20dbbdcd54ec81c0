"""A sweep over a key of a block the command line adds (`+scaled={factor: 2.5} scaled.factor=1,3`, the way a
user's kind is swept): the jobs ran factors 1 and 3, and inspect's table had a `scaled` column saying
{'factor': 2.5} in every row. The mapping's column leaves out what a later override sets. References: the
package's model called directly, times the factor the table says (the kind's rows, read with h5py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT

KIND = '''
    from dataclasses import dataclass

    import torch
    from hookrun.config.plugins import KindPlugin
    from hookrun.runner.kinds.run_kind import NOTHING, RunKind, plain_forward
    from hookrun.store.records import Capture, CaptureKey

    @dataclass
    class Block:
        factor: float = 1.0
        label: str = "sum"

    class Scaled(RunKind):
        def step(self, model, call, session):
            out = plain_forward(model, call) * self.ctx.cfg.swkind.factor
            self.ctx.env.captures.add(Capture(CaptureKey("swkind", "", "swkind", "sum"), out.sum(1), False,
                                              dims=("sample",)))
            return NOTHING

    def tiny():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))

    def data():
        return torch.utils.data.TensorDataset(torch.randn(6, 4, generator=torch.Generator().manual_seed(1)))

    KIND = KindPlugin("swkind", block=Block, run=Scaled)
    '''


@pytest.mark.slow
def test_a_swept_key_of_an_added_block_is_not_shown_at_the_blocks_own_value(tmp_path):
    import hookrun

    site = tmp_path / "site"
    (site / "swkind-0.1.dist-info").mkdir(parents=True)
    (site / "swkind.py").write_text(textwrap.dedent(KIND))
    (site / "swkind-0.1.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: swkind\nVersion: 0.1\n")
    (site / "swkind-0.1.dist-info/entry_points.txt").write_text("[hookrun.kinds]\nswkind = swkind:KIND\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "hookrun", "-m", "model=custom", "model._target_=swkind.tiny",
                           "data=custom", "data.dataset._target_=swkind.data", "data.batch_size=4", "device=cpu",
                           "progress=false", "+swkind={factor: 2.5, label: total}", "swkind.factor=1,3",
                           "hydra.sweep.dir=sweep"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    sys.path.insert(0, str(site))
    try:
        import swkind

        with torch.no_grad():
            sums = swkind.tiny().eval()(swkind.data().tensors[0]).sum(1).numpy()
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("swkind", None)
    sweep = hookrun.open_sweep(tmp_path / "sweep")
    table = sweep.table(stats=())
    assert sweep.swept == ["swkind.factor"]
    assert table.column("swkind") == [{"label": "total"}] * 2, table  # (it said {'factor': 2.5, 'label': 'total'})
    for row, job in zip(table.rows, sweep.jobs, strict=True):
        with h5py.File(job.file) as f:
            np.testing.assert_allclose(f["captures/swkind/__model__/sum"][:], sums * row["swkind.factor"], rtol=1e-6)
    assert sorted(table.column("swkind.factor")) == [1, 3]
