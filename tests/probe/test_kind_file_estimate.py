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


def raw_outputs(names: list[str]) -> dict[str, torch.Tensor]:
    """Each module's output for the first item, from a forward hook on the same net (the reference)."""
    net, out = Net(), {}
    for n in names:
        net.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: out.__setitem__(n, o.detach()))
    with torch.no_grad():
        net(data(1)[0]["x"][None])
    return out


def test_dry_run_says_what_the_probe_and_the_similarity_hold(tmp_path, capsys) -> None:
    """dry_run printed the model, the data and the file, and nothing of the kind's own work: which points a
    probe fits, with how many features (pool mean: a map's channels) and rows, which spill past probe.memory;
    which matrix a similarity run computes, by which route, over which features (flattened: every value)."""
    at = ["conv.0", "conv.1", "fc"]
    cfg = {"data": {"batch_size": 16, "inputs": ["x"]}, "device": "cpu", "progress": False, "dry_run": True,
           "output": {"path": str(tmp_path / "a.h5")}}
    hookrun.run({**cfg, "probe": {"at": at, "target": "label", "memory": "20KB"}}, model=Net(), dataset=data())
    lines = capsys.readouterr().out.splitlines()
    share, raw = 20_000 // 3, raw_outputs(at)
    head = [ln for ln in lines if ln.startswith("  probe ")]
    assert head == ["  probe logistic (C=1), pool mean, split.test 0.25 (seed 0); each of the 3 "
                    "point(s) holds 6.5 KiB of rows in memory (probe.memory), beyond it a spill file"]
    for name in at:
        features = raw[name].shape[1]  # (mean over space: the channels)
        spilled = " (spilled: over its share)" if 64 * features * 8 > share else ""
        row = next(ln for ln in lines if ln.split()[:1] == [name])
        assert row.split(None, 1)[1].startswith(f"{features} features x 64 rows = ") and row.endswith(f"B{spilled}"), row
    assert not (tmp_path / "a.h5").exists()
    hookrun.run({**cfg, "similarity": {"at": ["conv", "fc"]}}, model=Net(), dataset=data())
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  similarity "))
    dims = {n: v[0].numel() for n, v in raw_outputs(["conv", "fc"]).items()}
    assert line.startswith("  similarity linear_cka, estimator exact (gram route), pool flatten: a 2 x 2 matrix over 64 items")
    assert line.endswith(f"features at: conv {dims['conv']}, fc {dims['fc']}"), line
