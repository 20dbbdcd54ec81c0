"""The Markdown table of benchmarks/cache_peers.py: every target, its bound, met or not, and the figures behind it."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness

LABELS = {"bare": "bare forward (stopped after block 5)", "hookrun": "hookrun to a local file",
          "hookrun_s3": "hookrun to S3 (moto on 127.0.0.1)", "transformer_lens": "TransformerLens run_with_cache + torch.save",
          "nnsight": "nnsight trace + save + stop + torch.save", "saelens": "SAELens CacheActivationsRunner (Arrow)"}


def _median_rate(runs: list[dict]) -> float:
    return statistics.median(r["tokens"] / r["seconds"] for r in runs)


def _ratios(num: list[dict], den: list[dict], key: str) -> list[float]:
    """Per round: den[key] / num[key] (for times, num's rate over den's)."""
    return [d[key] / n[key] for n, d in zip(num, den, strict=True)]


def _close(a: list[float], b: list[float]) -> tuple[bool, float]:
    diff = max(abs(a[0] - b[0]) / abs(b[0]), abs(a[1] - b[1]), abs(a[2] - b[2]))
    return diff <= 1e-4, diff


def table(a, res: dict) -> str:
    runs, small, checks, reads, missing = res["runs"], res["small"], res["checks"], res["reads"], res["missing"]
    targets = harness.Targets()
    row = targets.add

    def compare(target: str, num: str, den: str, bound: float, at_least: bool) -> None:
        """The median of per-round ratios of num's rate to den's (or its time to den's: at_least False)."""
        if num not in runs or den not in runs:
            gone = [r for r in (num, den) if r not in runs]
            row(target, "not run", f"{'>=' if at_least else '<='} {bound}", None,
                "; ".join(f"{r}: {missing.get(r, 'not asked for (--routes)')}" for r in gone))
            return
        per = _ratios(runs[num], runs[den], "seconds") if at_least else _ratios(runs[den], runs[num], "seconds")
        cpu = _ratios(runs[num], runs[den], "cpu_s") if at_least else _ratios(runs[den], runs[num], "cpu_s")
        value = statistics.median(per)
        ok = value >= bound if at_least else value <= bound
        row(target, value, f"{'>=' if at_least else '<='} {bound}", ok,
            f"rounds {', '.join(f'{x:.2f}' for x in per)}; medians {_median_rate(runs[num]):.0f} / "
            f"{_median_rate(runs[den]):.0f} tokens/s; by CPU time {statistics.median(cpu):.3f}")

    compare("hookrun time / bare forward time", "hookrun", "bare", 1.05, at_least=False)
    for peer in ("transformer_lens", "nnsight", "saelens"):
        compare(f"hookrun / {LABELS[peer]} (tokens/s)", "hookrun", peer, 1.0, at_least=True)
    compare("hookrun to S3 / hookrun to a local file (tokens/s)", "hookrun_s3", "hookrun", 0.9, at_least=True)
    if reads["read_inorder"]:
        per = _ratios(reads["read_shuffled"], reads["read_inorder"], "seconds")
        rate = {k: statistics.median(r["rows_per_s"] for r in v) for k, v in reads.items()}
        row("hookrun loader: shuffled / in-order reads (rows/s)", statistics.median(per), ">= 0.5",
            statistics.median(per) >= 0.5, f"rounds {', '.join(f'{x:.2f}' for x in per)}; medians "
            f"{rate['read_shuffled']:.0f} / {rate['read_inorder']:.0f} rows/s; {a.rows} rows of 256 float32, batches of 4096, {a.read_epochs} epoch(s) per timed read")
    else:
        row("hookrun loader: shuffled / in-order reads (rows/s)", "not run", ">= 0.5", None, "hookrun: not run")
    for route in runs:
        peak = statistics.median(r["peak_mb"] for r in runs[route])
        grew = statistics.median(r["peak_mb"] - r["rss_before_mb"] for r in runs[route])
        s = small[route]
        target = route.startswith("hookrun")
        value = peak / s["peak_mb"]
        row(f"peak RSS {a.batches} / {a.rss_small} batches: {route}", value, "<= 1.10" if target else "(info)",
            value <= 1.10 if target else None, f"{peak:.0f} MB / {s['peak_mb']:.0f} MB; above the RSS before the run: "
            f"{grew:.0f} MB / {s['peak_mb'] - s['rss_before_mb']:.0f} MB")
    if "bare" in checks:
        for route, check in checks.items():
            if route != "bare" and check is not None:
                ok, diff = _close(check, checks["bare"])
                row(f"same activations as the bare forward: {route}", "equal" if ok else "differ", "(check)", ok,
                    f"first batch: sum |x| {check[0]:.6g} vs {checks['bare'][0]:.6g}; largest difference {diff:.2g}")
    return harness.document(command(), environment(a, res), targets.lines(), per_round(a, runs, reads))


def per_round(a, runs: dict, reads: dict) -> str:
    def series(values: list[dict], key: str, fmt: str) -> str:
        return " / ".join(format(v[key], fmt) for v in values)

    parts = [f"{r}: {series(v, 'seconds', '.2f')}" for r, v in runs.items()]
    text = f"Per round (seconds for {a.batches} batches, {a.batches * 1024} tokens): " + ", ".join(parts) + "."
    if reads["read_inorder"]:
        text += " Reads (rows/s): " + ", ".join(f"{k}: {series(v, 'rows_per_s', '.0f')}" for k, v in reads.items()) + "."
    return text


def command() -> str:
    exe = sys.executable if Path(sys.executable).parent.parent.name != Path(sys.base_prefix).name else "python"
    return harness.command("cache_peers.py", exe)


def environment(a, res: dict) -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = "?"
    workers = "; ".join(f"{py} ({', '.join(f'{k} {v}' for k, v in vers.items())}): {', '.join(hosts) or 'nothing'}"
                        for py, vers, hosts in res["versions"])
    return (f"{platform.machine()}, {os.cpu_count()} CPUs (load average {res['load'][0]:.1f} at the start, "
            f"{res['load'][1]:.1f} at the end), device {a.device}, {a.threads} torch thread(s) per worker, Python "
            f"{platform.python_version()}, hookrun at {commit}, {time.strftime('%Y-%m-%d')}, {res['seconds']:.0f} s; "
            f"GPT-2 8 blocks x 256 (random init), vocabulary 50257, the residual stream after block(s) "
            f"{', '.join(str(b) for b in range(6 - a.points, 6))} (every token), "
            f"{a.batches} batches of 8 x 128 tokens, {a.rounds} round(s) in random order, S3 parts of {a.part_mb:g} MiB. "
            f"Workers: {workers}")
