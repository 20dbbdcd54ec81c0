"""The benchmark commands run from a fresh install (their figures are in docs/benchmarks.md, not here:
timings on a shared CI machine prove nothing, so this checks only that every comparison runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import NamedTuple

import pytest
import torch
from bench_quick import quick
from conftest import ROOT


class Expect(NamedTuple):
    rows: list[str]  # the rows its table must have, each by its start: `| ROW`
    text: list[str]  # other text the table must hold: the machine and versions, sizes
    needs: tuple[str, ...] = ()  # modules it needs (skipped without them)
    timeout: int = 600


QUICK = {
    "run.py": Expect(
        ["1. record / no hooks", "2. record / tutorial script", "3. peak RSS 2 / 1 batches",
         "4. writer bytes/s / one h5py write", "5. cost per hook firing", "early stop: layer1", "create_feature_extractor + h5py"],
        ["torch ", "h5py "], timeout=900),
    "cache.py": Expect(
        ["1. bare forward tokens/s / hookrun caching tokens/s", "2. hookrun / TransformerLens", "2. hookrun / nnsight",
         "2. hookrun / plain hooks + datasets save_to_disk", "2. peak RSS 2 / 1 batches: hookrun",
         "3. shuffled read / in-order read", "3. hookrun shuffled / h5py fancy indexing", "4. file size: hookrun /"],
        ["torch ", "h5py ", "nnsight"], timeout=900),
    "generate.py": Expect(
        ["hookrun record every block, every token / bare generate |", "hookrun steering hook alone / bare generate |",
         "hookrun steering hook / raw steering hook |"],
        ["token rows x 2 blocks"]),
    "op_sites.py": Expect(
        ["A / B: attention patterns via op sites / attention outputs via module hooks |",
         "A / D: the same bytes via op sites / via the module's output.1 |", "B / C: module hooks / no hooks |",
         "A / C: op sites / no hooks |"],
        ["A_sites", "torch "]),
    "object_store.py": Expect(  # hookrun to a local S3 server and to disk, the URL loader shuffled and in order
        ["hookrun to a local S3 server / to local disk (tokens/s)", "writer-bound run: to S3 / to local disk",
         "URL loader: shuffled / in order (rows/s)"],
        ["s3fs ", "moto ", "the S3 server"], needs=("moto.server",)),
    "evaluate.py": Expect(
        ["evaluate (ablation: zero) / plain forward |", "evaluate / hookrun run without evaluate |",
         "hookrun run without evaluate / plain forward |"],
        ["<= 3.2", "torch "]),
    # the bare forward, hookrun and hookrun to a local S3 server run (moto[server] and s3fs come with
    # the dev extra; a peer whose library is missing is a row saying so), and hookrun's cached
    # activations equal those a plain forward hook sees (the route checks its first batch after the clock)
    "patching.py": Expect(
        ["1. exact head grid, tiny: 2 layers", "1. tiny: the same grid, every hookrun route: max abs difference",
         "1. tiny: hookrun_no_equal_cells / hookrun_full_path (time)", "1. exact head grid, wide: 2 layers",
         "1. wide: the same grid, every hookrun route: max abs difference", "2. one process per cell (extrapolated)",
         "3. atp / exact on the shipped task",
         "3. atp vs exact: Spearman rank correlation"],
        ["transformer-lens ", "extrapolated"], needs=("transformer_lens",), timeout=900),
    "process_pair.py": Expect(  # issue 41 item 18: whole `python -m hookrun` process / the tutorial script
        ["whole process: hookrun / tutorial script (wall)", "whole process: hookrun / tutorial script (CPU)"],
        ["torch ", "1-minute load average"]),
    "report.py": Expect(["report size (MB)", "report time (s)"], ["GB run", "torch "]),
    "attribution.py": Expect(
        ["integrated_gradients: hookrun run / captum hand loop (wall)", "integrated_gradients: max abs difference",
         "occlusion: hookrun run / captum hand loop (wall)", "occlusion: max abs difference", "occlusion: peak memory"],
        ["captum ", "load average"], needs=("captum",)),
    "similarity.py": Expect(  # issue 48 item 3: a linear-CKA matrix of 4 layers, the bare forward, a hand script
        ["hookrun / bare forward (wall)", "script / bare forward (wall)", "hookrun / script (wall)",
         "max abs difference of the matrices", "peak RSS above the bare forward: hookrun (MB)",
         "peak RSS above the bare forward: script (MB)"],
        ["torch ", "load average"]),
    "probe.py": Expect(  # issue 48 item 3: probes of 4 layers, the bare forward, a scikit-learn hook script
        ["probe pass / bare forward (time)", "hookrun run / sklearn script (time)", "hookrun / sklearn script (peak RSS)",
         "test accuracy, hookrun - sklearn (max abs)"],
        ["torch ", "scikit-learn ", "by CPU time", "hookrun's process imported scikit-learn: no"], needs=("sklearn",)),
    "early_stop.py": Expect(
        ["early_stop / bare_body (wall)", "full_probe / bare_body (wall)", "bare_cut / bare_body (wall)",
         "early_stop / bare_cut (wall)", "full_forward / bare_full (wall)"],
        ["torch ", "transformers ", "by CPU time"]),
    "cache_peers.py": Expect(
        ["hookrun time / bare forward time", "hookrun / TransformerLens", "hookrun / nnsight", "hookrun / SAELens",
         "hookrun to S3 / hookrun to a local file", "hookrun loader: shuffled / in-order reads",
         "peak RSS 2 / 1 batches: hookrun", "peak RSS 2 / 1 batches: hookrun_s3",
         "same activations as the bare forward: hookrun | equal | (check) | yes |"],
        ["torch ", "h5py "]),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", list(QUICK))
def test_benchmark_quick_mode_runs_every_comparison(tmp_path, script):
    expect = QUICK[script]
    for module in expect.needs:
        pytest.importorskip(module)
    table = quick(tmp_path, script, timeout=expect.timeout)
    for row in expect.rows:
        assert f"| {row}" in table, row
    for part in expect.text:
        assert part in table, part


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HOOKRUN_BENCH_PYTHONS"), reason="set HOOKRUN_BENCH_PYTHONS to the peers' "
                    "interpreters (os.pathsep-separated), e.g. /work/venvs/bench/bin/python:/work/venvs/saelens/bin/python")
def test_cache_peers_quick_mode_with_every_peer(tmp_path):
    """With the peers' venvs: every route runs, in the worker of the first interpreter that has its
    library, and every route cached the activations a plain forward hook sees."""
    args = [a for py in os.environ["HOOKRUN_BENCH_PYTHONS"].split(os.pathsep) for a in ("--python", py)]
    table = quick(tmp_path, "cache_peers.py", *args)
    for row in QUICK["cache_peers.py"].rows:
        assert f"| {row}" in table, row
    assert "not run" not in table
    for route in ("hookrun", "transformer_lens", "nnsight", "saelens"):
        assert f"| same activations as the bare forward: {route} | equal | (check) | yes |" in table, route


def test_harness_pairs_rounds_and_writes_the_table(tmp_path, monkeypatch):
    """benchmarks/harness.py: the median of per-round ratios (not the ratio of medians), every route
    once a round in the order given, and the table appended after a blank line."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import harness

    times = {"a": [1.0, 4.0, 9.0], "b": [2.0, 1.0, 3.0]}  # per-round ratios 0.5, 4, 3
    assert harness.ratio(times, "a", "b") == 3.0  # the ratio of medians would be 4 / 2 = 2
    calls = []
    timed = harness.paired_rounds({"x": lambda: calls.append("x") or 1, "y": lambda: calls.append("y") or 2}, 2,
                                  lambda r, order: order.reverse())
    assert calls == ["x", "y", "y", "x", "x", "y"] and timed.first == {"x": 1, "y": 2}
    assert [len(v) for v in (*timed.wall.values(), *timed.cpu.values())] == [2, 2, 2, 2]
    t = harness.Targets()
    t.add("speed", 1.23456, "<= 1.10", False, "detail")
    t.add("check", "equal", "(check)", None, "")
    assert t.rows == ["| speed | 1.235 | <= 1.10 | NO | detail |", "| check | equal | (check) |  |  |"]
    path = tmp_path / "t.md"
    path.write_text("before\n")
    harness.save("`cmd`\n\nhead\n", path, append=True)
    harness.save("second", path, append=True)
    assert path.read_text() == "before\n\n`cmd`\n\nhead\n\nsecond\n"


@pytest.mark.parametrize("device", ["tpu"] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_cache_peers_refuses_a_device_it_cannot_use_in_one_line_before_any_worker(device):
    """`--device tpu` (not a torch device), or `--device cuda` on a machine without CUDA: exit 2 and
    one error line naming the flag and what to give instead, no traceback, no worker started."""
    proc = subprocess.run([sys.executable, "benchmarks/cache_peers.py", "--quick", "--device", device],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "setup" not in proc.stderr and proc.stdout == ""  # no worker started
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cache_peers.py: error: --device {device!r}" if device == "tpu" else
                           "cache_peers.py: error: --device cuda: CUDA is not available"), last
    assert "use cpu" in last or "use --device cpu" in last


def test_a_docstring_markdown_target_is_no_page_the_script_would_replace():
    """Every `--markdown PATH` a benchmark's usage lines give: a docs page (or any file in the repo) only where the
    script appends its table (`append=True`): `probe.py --markdown docs/benchmarks/probe.md` replaced that
    92-line page with its 10-line table; and never a page under docs/ that does not exist (a stray page)."""
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        source = script.read_text()
        appends = "append=True" in source
        for target in re.findall(r"^\s*python benchmarks/\S+ .*?--markdown (\S+)", source, re.MULTILINE):
            path = ROOT / target
            if path.exists():
                assert appends, f"{script.name}: --markdown {target} would replace that file"
            else:
                assert not target.startswith("docs/"), f"{script.name}: --markdown {target} is no page of docs/"
