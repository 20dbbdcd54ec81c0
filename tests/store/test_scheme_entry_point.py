"""A second scheme from a user's package, outside hookrun/: one module and one entry point of the group
`hookrun.schemes` (a dist-info folder on sys.path, as pip leaves it). The scheme's register_scheme, run
through `imports:`, reached the run's own process only: `python -m hookrun.inspect dbl://...` said "no
filesystem for dbl:// is installed; install fsspec's filesystem for dbl://". References: the package's
model called with a raw forward hook (the rows), h5py on the scheme's own store (the file)."""

from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest
import torch
from site_package import TINY_MODEL_AND_DATA, imported, install, site_env
from warm_python import python as warm

MODULE = '''
    import os
    from pathlib import Path

    import torch
    from hookrun.output import LocalFile
    from hookrun.store.reading import LocalSource
    from hookrun.store.paths import Scheme

    def place(url):
        return Path(os.environ["DBL_STORE"]) / str(url).split("://", 1)[1]

    def destination(cfg):
        place(cfg.output.path).parent.mkdir(parents=True, exist_ok=True)
        return LocalFile(place(cfg.output.path))

    def source(path, cache_dir=None):
        return LocalSource(place(path))

    SCHEME = Scheme("dbl", True, "dblstore:destination", "dblstore:source")
    NOT_A_SCHEME = {"name": "nope"}
    ''' + TINY_MODEL_AND_DATA


def cli(tmp_path, module: str, *args: str) -> subprocess.CompletedProcess:
    env = site_env(tmp_path / "site", DBL_STORE=str(tmp_path / "store"))
    return warm(["-m", module, *args], cwd=tmp_path,
                timeout=300, env=env)


@pytest.mark.slow
def test_a_scheme_a_package_declares_writes_and_every_command_reads_it(tmp_path):
    site = install(tmp_path / "site", "dblstore", MODULE,
                   "[hookrun.schemes]\ndbl = dblstore:SCHEME\nnope = dblstore:NOT_A_SCHEME\n")
    url = "dbl://runs/one/captures.h5"
    done = cli(tmp_path, "hookrun", "model=custom", "model._target_=dblstore.tiny", "data=custom",
               "data.dataset._target_=dblstore.data", "data.batch_size=4", "device=cpu", "progress=false",
               "hooks={h: {at: '0', type: forward, actions: [record]}}", f"output.path={url}", "hydra.run.dir=out")
    assert done.returncode == 0, done.stderr
    with imported(site, "dblstore") as dblstore:
        model, x = dblstore.tiny().eval(), dblstore.data().tensors[0]
    seen = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        model(x)
    with h5py.File(tmp_path / "store/runs/one/captures.h5") as f:
        assert f.attrs["status"] == "complete"
        np.testing.assert_allclose(f["captures/h/0/output"][:], seen[0].numpy(), rtol=1e-6)
    shown = cli(tmp_path, "hookrun.inspect", url)  # a process that imported no module of the run's
    assert shown.returncode == 0, shown.stderr
    out = seen[0].numpy()
    assert "h/0/output  (6, 3)" in shown.stdout and f"mean {out.mean():.4g} std {out.std():.4g}" in shown.stdout, shown.stdout
    drawn = cli(tmp_path, "hookrun.plot", url, "--out", str(tmp_path / "figures"))
    assert drawn.returncode == 0 and (tmp_path / "figures/hist_h__0__output.png").is_file(), drawn.stderr
    wrong = cli(tmp_path, "hookrun.inspect", "nope://runs/one/captures.h5")
    assert wrong.returncode == 2 and wrong.stderr == (
        "hookrun.inspect: error: nope:// paths: the entry point 'nope' of hookrun.schemes (dblstore:NOT_A_SCHEME) is "
        "dict, not a hookrun.store.paths.Scheme\n"), wrong.stderr
