"""A sweep over a key of a block the command line adds (`+scaled={factor: 2.5} scaled.factor=1,3`, the way a
user's kind is swept): the jobs ran factors 1 and 3, and inspect's table had a `scaled` column saying
{'factor': 2.5} in every row. The mapping's column leaves out what a later override sets. References: the
package's model called directly, times the factor the table says (the kind's rows, read with h5py)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from site_package import imported, install, scaled_kind, site_env
from warm_python import python as warm

KIND = scaled_kind("swkind", fields='label: str = "sum"')


@pytest.mark.slow
def test_a_swept_key_of_an_added_block_is_not_shown_at_the_blocks_own_value(tmp_path):
    import hookrun

    site = install(tmp_path / "site", "swkind", KIND, "[hookrun.kinds]\nswkind = swkind:KIND\n")
    env = site_env(site)
    done = warm(["-m", "hookrun", "-m", "model=custom", "model._target_=swkind.tiny",
                 "data=custom", "data.dataset._target_=swkind.data", "data.batch_size=4", "device=cpu",
                 "progress=false", "+swkind={factor: 2.5, label: total}", "swkind.factor=1,3",
                 "hydra.sweep.dir=sweep"], cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    with imported(site, "swkind") as swkind, torch.no_grad():
        sums = swkind.tiny().eval()(swkind.data().tensors[0]).sum(1).numpy()
    sweep = hookrun.open_sweep(tmp_path / "sweep")
    table = sweep.table(stats=())
    assert sweep.swept == ["swkind.factor"]
    assert table.column("swkind") == [{"label": "total"}] * 2, table  # (it said {'factor': 2.5, 'label': 'total'})
    for row, job in zip(table.rows, sweep.jobs, strict=True):
        with h5py.File(job.file) as f:
            np.testing.assert_allclose(f["captures/swkind/__model__/sum"][:], sums * row["swkind.factor"], rtol=1e-6)
    assert sorted(table.column("swkind.factor")) == [1, 3]
