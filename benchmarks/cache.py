"""hookrun as an activation cache, against the routes users take today: `python benchmarks/cache.py`.

Writing: a GPT-2-shaped random-init model (benchmarks/cache_scenarios.py), six residual-stream hook
points, 128-token sequences, every route stopped after the last cached block. Reading: the same
token rows as a hookrun file and as a `datasets` folder (benchmarks/cache_reads.py). Each route runs
in its own child process (peak RSS from os.wait4), interleaved round after round after an
os.sync(); ratios are taken between medians.

    python benchmarks/cache.py                   # the full comparison (about 15 minutes on 2 cores)
    python benchmarks/cache.py --quick           # a smoke run: 2 batches, 1 round, small files, peak RSS of the short run for hookrun only
    python benchmarks/cache.py --markdown table.md   # also write the table there (replacing the file; the figures: docs/benchmarks/caches.md)

The `transformer_lens` route needs TransformerLens 4.3, which the `dev` environment cannot hold (it
has 3.9, for HookedTransformer): run this file with the interpreter of the venv that
`bash tests/envs/make_tl4.sh /opt/tl4` makes (`/opt/tl4/bin/python benchmarks/cache.py`); elsewhere
that route is reported as not installed.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent
WRITERS = ["bare", "hookrun", "hooks_torch_save", "transformer_lens", "nnsight", "datasets"]
PEERS = {"transformer_lens": "transformer_lens", "nnsight": "nnsight", "datasets": "datasets"}
MAJOR = {"transformer_lens": ("transformer-lens", 4)}  # the route is TransformerLens 4's; dev holds 3.9
HOW = {"transformer_lens": "TransformerLens 4.3 is in the venv of tests/envs/make_tl4.sh: run this file with its python"}
READS = ["read_inorder", "read_shuffled", "read_datasets_inorder", "read_datasets_shuffled", "read_h5py_fancy"]


def _has(module: str, dist: str = "", major: int = 0) -> bool:
    """Whether `module` is installed (its distribution `dist` at version `major` or later)."""
    from importlib import metadata

    if importlib.util.find_spec(module) is None:
        return False
    try:
        return not dist or int(metadata.version(dist).split(".")[0]) >= major
    except (metadata.PackageNotFoundError, ValueError):
        return False


def child(name: str, folder: Path, threads: int, batches: int = 0, rows: int = 0) -> dict:
    harness.sync()
    cmd = [sys.executable, str(HERE / "cache_scenarios.py"), name, "--batches", str(batches), "--rows", str(rows),
           "--dir", str(folder), "--threads", str(threads)]
    result, usage = harness.run_child(cmd, f"scenario {name}", harness.child_env(), warm=harness.QUICK)
    result["rss_mb"] = usage.ru_maxrss / 1024  # Linux: KiB
    return result


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--batches", type=int, default=60, help="batches of 8 x 128 tokens per writing run (default 60)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rss-small", type=int, default=8, help="batches of the short run whose peak RSS is set against the timed runs'")
    p.add_argument("--rows", type=int, default=262144, help="token rows in the read benchmark's file (default 262144, 256 MiB)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per child (default 1 of this machine's cores)")
    harness.quick_and_markdown(p, "2 batches, 1 round, 16384 rows: checks that everything runs")
    p.add_argument("--dir", type=Path)
    a = harness.parse(p, batches=2, rounds=1, rss_small=1, rows=16384)
    log = harness.log
    started = time.time()
    missing = [route for route, mod in PEERS.items() if not _has(mod, *MAJOR.get(route, ("", 0)))]
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
            if a.quick and name != "hookrun":  # (a smoke run: the peers' short runs are their timed runs' code again)
                continue
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
    targets = harness.Targets()
    row = targets.add
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
            row(f"2. hookrun / {label}", "not installed", bound, False,
                HOW.get(name, f"pip install {name.replace('_', '-')} failed or was not run"))
            continue
        r = tps["hookrun"] / tps[name]
        row(f"2. hookrun / {label} (tokens/s)", r, bound, None if bound == "(info)" else r >= 1.0,
            f"{tps[name]:.0f} tokens/s (median {med[name]:.0f}; hookrun {med['hookrun']:.0f})")
    small, large = a.rss_small, a.batches
    for name in (name for name in w if (name, small) in rss):
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

    env = harness.environment(seconds, *harness.module_versions("torch", "h5py"),
                              *harness.versions("transformers", "transformer-lens", "nnsight", "datasets"),
                              threads=f"{a.threads} torch thread(s) per route")
    return harness.report("cache.py", env, targets.lines(), markdown=a.markdown)


if __name__ == "__main__":
    main()
