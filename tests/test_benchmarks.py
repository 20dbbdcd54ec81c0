"""The benchmark command runs from a fresh install (its figures are in docs/benchmarks.md, not here:
timings on a shared CI machine prove nothing, so this checks only that every comparison runs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.slow
def test_benchmark_quick_mode_runs_every_comparison(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--markdown", str(tmp_path / "b.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "b.md").read_text()
    for row in ("1. record / no hooks", "2. record / tutorial script", "3. peak RSS 4 / 2 batches",
                "4. writer bytes/s / one h5py write", "5. cost per hook firing", "early stop: layer1",
                "create_feature_extractor + h5py"):
        assert f"| {row}" in table, row
    assert "torch " in table and "h5py " in table  # the machine and versions


@pytest.mark.slow
def test_cache_benchmark_quick_mode_runs_every_route(tmp_path):
    """benchmarks/cache.py --quick: every writing route and reader runs, or a peer is reported as not installed."""
    proc = subprocess.run([sys.executable, "benchmarks/cache.py", "--quick", "--markdown", str(tmp_path / "c.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "c.md").read_text()
    for row in ("1. bare forward tokens/s / hookrun caching tokens/s", "2. hookrun / TransformerLens", "2. hookrun / nnsight",
                "2. hookrun / plain hooks + datasets save_to_disk", "2. peak RSS 2 / 1 batches: hookrun",
                "3. shuffled read / in-order read", "3. hookrun shuffled / h5py fancy indexing", "4. file size: hookrun /"):
        assert f"| {row}" in table, row
    assert "torch " in table and "h5py " in table and "nnsight" in table  # the machine and versions


@pytest.mark.slow
def test_generate_benchmark_quick_mode_runs_every_route(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/generate.py", "--quick", "--markdown", str(tmp_path / "g.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "g.md").read_text()
    for row in ("hookrun record every block, every token / bare generate", "hookrun steering hook alone / bare generate",
                "hookrun steering hook / raw steering hook"):
        assert f"| {row}" in table, row
    assert "token rows x 2 blocks" in table


@pytest.mark.slow
def test_op_sites_benchmark_quick_mode_runs_every_route(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/op_sites.py", "--quick", "--markdown", str(tmp_path / "o.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "o.md").read_text()
    for row in ("A / B: attention patterns via op sites / attention outputs via module hooks",
                "A / D: the same bytes via op sites / via the module's output.1", "B / C: module hooks / no hooks",
                "A / C: op sites / no hooks"):
        assert f"| {row} |" in table, row
    assert "A_sites" in table and "torch " in table

def test_object_store_benchmark_quick_mode_runs_every_comparison(tmp_path):
    """benchmarks/object_store.py --quick: hookrun to a local S3 server and to disk, the URL loader shuffled and in order."""
    pytest.importorskip("moto.server")
    proc = subprocess.run([sys.executable, "benchmarks/object_store.py", "--quick", "--markdown", str(tmp_path / "o.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "o.md").read_text()
    for row in ("hookrun to a local S3 server / to local disk (tokens/s)", "writer-bound run: to S3 / to local disk",
                "URL loader: shuffled / in order (rows/s)"):
        assert f"| {row}" in table, row
    assert "s3fs " in table and "moto " in table and "the S3 server" in table


@pytest.mark.slow
def test_evaluate_benchmark_quick_mode_runs_every_route(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/evaluate.py", "--quick", "--markdown", str(tmp_path / "e.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "e.md").read_text()
    for row in ("evaluate (ablation: zero) / plain forward", "evaluate / hookrun run without evaluate",
                "hookrun run without evaluate / plain forward"):
        assert f"| {row} |" in table, row
    assert "<= 3.2" in table and "torch " in table


CACHE_PEER_ROWS = ("hookrun time / bare forward time", "hookrun / TransformerLens", "hookrun / nnsight", "hookrun / SAELens",
                   "hookrun to S3 / hookrun to a local file", "hookrun loader: shuffled / in-order reads",
                   "peak RSS 2 / 1 batches: hookrun")


def _cache_peers(tmp_path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "benchmarks/cache_peers.py", "--quick", "--markdown", str(tmp_path / "p.md"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "p.md").read_text()
    for row in CACHE_PEER_ROWS:
        assert f"| {row}" in table, row
    return table


@pytest.mark.slow
def test_cache_peers_quick_mode_runs_the_routes_this_python_has(tmp_path):
    """benchmarks/cache_peers.py --quick: the bare forward, hookrun and hookrun to a local S3 server
    run (a peer whose library is missing is a row saying so), and hookrun's cached activations equal
    those a plain forward hook sees (the route checks its first batch after the clock)."""
    table = _cache_peers(tmp_path)
    assert "| same activations as the bare forward: hookrun | equal | (check) | yes |" in table
    assert "| peak RSS 2 / 1 batches: hookrun_s3" in table  # moto[server] and s3fs come with the dev extra
    assert "torch " in table and "h5py " in table


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HOOKRUN_BENCH_PYTHONS"), reason="set HOOKRUN_BENCH_PYTHONS to the peers' "
                    "interpreters (os.pathsep-separated), e.g. /work/venvs/bench/bin/python:/work/venvs/saelens/bin/python")
def test_cache_peers_quick_mode_with_every_peer(tmp_path):
    """With the peers' venvs: every route runs, in the worker of the first interpreter that has its
    library, and every route cached the activations a plain forward hook sees."""
    args = [a for py in os.environ["HOOKRUN_BENCH_PYTHONS"].split(os.pathsep) for a in ("--python", py)]
    table = _cache_peers(tmp_path, *args)
    assert "not run" not in table
    for route in ("hookrun", "transformer_lens", "nnsight", "saelens"):
        assert f"| same activations as the bare forward: {route} | equal | (check) | yes |" in table, route
