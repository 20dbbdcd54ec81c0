"""The HTML report of a large run: `python benchmarks/report.py [--quick] [--markdown FILE]`.

A run of about `--gigabytes` GB is written first (a 1x1 conv of 64 channels over random 3 x 64 x 64
images, its output recorded: 1 MiB a sample, plus its input), then `python -m hookrun.report` is
timed on it in a child process (`--rounds` times, the median): the page must stay under 20 MB and be
written in under a minute, whatever the run's size (exact statistics read block by block,
histograms from a bounded sample, maps of the first samples only).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hookrun  # noqa: E402
from hookrun.data import RandomTensors  # noqa: E402

SIZE_BOUND, SECONDS_BOUND = 20e6, 60.0


def write_run(folder: Path, gigabytes: float) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 1), torch.nn.ReLU()).eval()
    samples = max(16, int(gigabytes * 1e9 / (64 * 64 * 64 * 4)))
    cfg = {"data": {"batch_size": 16}, "device": "cpu", "progress": False,
           "hooks": {"maps": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
                     "images": {"at": "", "type": "forward_pre", "actions": [{"name": "record", "what": "input", "limit": 64}]}},
           "output": {"path": str(folder / "captures.h5"), "overwrite": True}}
    return hookrun.run(cfg, model=model, dataset=RandomTensors(samples, (3, 64, 64), 10, seed=0)).path


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--gigabytes", type=float, default=1.0)
    harness.int_options(p, rounds=3)
    harness.quick_and_markdown(p, "a 0.05 GB run, 1 round: checks that it runs", "append the results table to this file")
    a = harness.parse(p, gigabytes=0.05, rounds=1)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp), a.gigabytes)
        run_bytes = run.stat().st_size
        seconds, size = [], 0
        for _ in range(a.rounds):
            harness.sync()
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "hookrun.report", str(run)], capture_output=True, text=True,
                                  env=harness.child_env())
            seconds.append(time.perf_counter() - t)
            if proc.returncode != 0:
                raise SystemExit(f"report failed: {proc.stderr[-2000:]}")
            size = (run.parent / "report.html").stat().st_size
    med = statistics.median(seconds)
    lines = ["| measure | value | bound | met | detail |", "|---|---|---|---|---|",
             f"| report size (MB) | {size / 1e6:.2f} | < {SIZE_BOUND / 1e6:.0f} | {'yes' if size < SIZE_BOUND else 'NO'} | "
             f"of a {run_bytes / 1e9:.2f} GB run |",
             f"| report time (s) | {med:.1f} | < {SECONDS_BOUND:.0f} | {'yes' if med < SECONDS_BOUND else 'NO'} | "
             f"median of {len(seconds)}: {', '.join(f'{s:.1f}' for s in seconds)} s (python -m hookrun.report, a fresh process) |"]
    head = (f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
            f"{time.time() - started:.0f} s; a {run_bytes / 1e9:.2f} GB run: one 64 x 64 x 64 float32 map a sample, "
            f"{run_bytes // (64 * 64 * 64 * 4)} samples")
    print(harness.report("report.py", head, lines, markdown=a.markdown, append=True), end="")


if __name__ == "__main__":
    main()
