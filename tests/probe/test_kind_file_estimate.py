"""`output.max_bytes` against the file a probe or similarity run writes: the estimate (dry_run's, the
figure max_bytes is held against) must not be below the file's size on disk, as docs/config.md says of
an uncompressed file. Before: the probe's groups, attributes and headers and the similarity matrix's
groups were left out, and a probe_shapes run of 50,448 bytes was estimated at 36,422, so
`output.max_bytes=40KB` let it run. Reference: os.path.getsize of the finished file."""

from __future__ import annotations

import os

import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("sklearn")
from test_probe_kind import Net  # noqa: E402  (the probe tests' small conv net)


def data(n: int = 64) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 2, 8, 8, generator=g)
    y = (x[:, 0].mean((1, 2)) > 0).long() + (x[:, 1].mean((1, 2)) > 0).long()
    return [{"x": x[i], "label": y[i]} for i in range(n)]


def run(path, kind: dict, max_bytes: int | None = None) -> None:
    cfg = {"data": {"batch_size": 16, "inputs": ["x"]}, "device": "cpu", "progress": False,
           "output": {"path": str(path), "overwrite": True, "max_bytes": max_bytes}, **kind}
    hookrun.run(cfg, model=Net(), dataset=data())


@pytest.mark.parametrize("kind", [
    {"probe": {"at": ["conv", "fc"], "target": "label", "control": True}},
    {"probe": {"at": ["conv.0", "conv.1", "fc"], "target": "label", "control": False, "memory": "20KB"}},
    {"similarity": {"at": ["conv", "fc"], "measure": "linear_cka"}},
], ids=["probe", "probe-spilled", "similarity"])
def test_max_bytes_refuses_a_run_whose_file_is_larger(tmp_path, kind: dict) -> None:
    run(tmp_path / "a.h5", kind)
    size = os.path.getsize(tmp_path / "a.h5")
    with pytest.raises(ConfigError, match="exceeds output.max_bytes"):
        run(tmp_path / "b.h5", kind, max_bytes=size - 1)
    assert not (tmp_path / "b.h5").exists()
