"""Destinations and sources by scheme (issue 46 item 2): one registry (hookrun/store/paths.py) says
where a path is written and read; a second scheme is one module and this test.

The double scheme `dbl://NAME/FILE` keeps its runs in a folder of its own (a stand-in for another
store): the run is written and locked through its destination, read through its source and handed
to the user as its own reader (DblRun), and the values equal the model called directly."""

from __future__ import annotations

import subprocess

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT
from torch import nn

import hookrun
from hookrun.analysis.run_reader import Run
from hookrun.output import LocalFile
from hookrun.store.paths import LOCAL, OBJECTS, SCHEMES, Scheme, register_scheme, scheme_of
from hookrun.store.reading import LocalSource

HOME: dict[str, object] = {}


def dbl_path(url: str):
    return HOME["root"] / url.split("://", 1)[1]


def dbl_destination(cfg):
    path = dbl_path(cfg.output.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    HOME["written"] = path
    return LocalFile(path)


def dbl_source(path, cache_dir=None):
    HOME["read"] = dbl_path(str(path))
    return LocalSource(dbl_path(str(path)))


class DblRun(Run):
    """The double scheme's reader: a Run that also says where in its store the run is kept."""

    def __init__(self, source: LocalSource) -> None:
        HOME["reader"] = source
        super().__init__(source)

    @property
    def kept_at(self):
        return self.source.path


@pytest.fixture
def dbl(tmp_path):
    HOME.clear()
    HOME["root"] = tmp_path / "dbl-store"
    register_scheme(Scheme("dbl", True, f"{__name__}:dbl_destination", f"{__name__}:dbl_source", f"{__name__}:DblRun"))
    yield
    SCHEMES.pop("dbl", None)
    SCHEMES.pop("plain", None)


def test_every_path_has_one_scheme():
    assert scheme_of("outputs/run/captures.h5") is LOCAL
    assert scheme_of("file:///tmp/x.h5") is LOCAL and scheme_of("C:/x.h5") is LOCAL
    assert scheme_of("s3://bucket/cache/captures.h5") is OBJECTS
    assert scheme_of("gcs://bucket/x") is OBJECTS  # any other fsspec URL: the object store
    assert scheme_of("S3://bucket/x") is OBJECTS


def test_a_second_scheme_writes_and_reads_through_its_own_module(dbl, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    data = torch.utils.data.TensorDataset(torch.randn(6, 4), torch.zeros(6, dtype=torch.long))
    cfg = {"hooks": {"h": {"at": "0", "type": "forward", "actions": ["record"]}}, "device": "cpu", "progress": False,
           "data": {"batch_size": 4}, "output": {"path": "dbl://runs/one/captures.h5"}}
    hookrun.run(cfg, model=model, dataset=data)
    assert HOME["written"] == tmp_path / "dbl-store/runs/one/captures.h5"
    with torch.no_grad():
        want = model[0](data.tensors[0]).numpy()
    with hookrun.open_run("dbl://runs/one/captures.h5") as run:  # through the scheme's source and reader
        assert type(run) is DblRun and run.kept_at == HOME["written"]
        np.testing.assert_allclose(run["0", "output"][:], want, rtol=1e-6)
        assert run.status == "complete" and run.find("0", "output").shape == want.shape
    assert HOME["read"] == HOME["written"] and HOME["reader"].path == HOME["written"]
    register_scheme(Scheme("plain", True, f"{__name__}:dbl_destination", f"{__name__}:dbl_source"))
    with hookrun.open_run("plain://runs/one/captures.h5") as run:  # a scheme with no reader of its own: a Run
        assert type(run) is Run
        np.testing.assert_allclose(run["0", "output"][:], want, rtol=1e-6)
    with h5py.File(HOME["written"]) as f:
        assert f.attrs["status"] == "complete"


def test_only_the_registry_asks_whether_a_path_is_a_url():
    out = subprocess.run(["grep", "-rnE", r"is_url|startswith\(.s3://.\)|\"://\" (not )?in", "hookrun"], cwd=ROOT,
                         capture_output=True, text=True)
    places = {line.split(":", 1)[0] for line in out.stdout.splitlines()}
    assert places <= {"hookrun/store/paths.py"}, out.stdout
