"""Text views of a run and a sweep, as `python -m hookrun.inspect` prints them."""

from __future__ import annotations

from hookrun.analysis.run import Run, block_stats
from hookrun.analysis.sweep import Sweep


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def describe_run(run: Run, stats: bool = True) -> str:
    a = run.attrs
    cfg = run.config
    data = (cfg.get("data") or {}).get("dataset") or {}
    lines = [
        f"{run.path}",
        f"  status    {a.get('status')}   ({a.get('steps_complete')} batches, {a.get('samples_complete')} samples)",
        f"  model     {a.get('model_class')} on {a.get('device')}, mode {a.get('mode')}",
        f"  data      {data.get('_target_', '?')}, batch {cfg.get('data', {}).get('batch_size')}",
        f"  written   {a.get('created')} .. {a.get('finished', '(not finished)')}, hookrun {a.get('hookrun_version')}, torch {a.get('torch_version')}",
        f"  hooks     {_hooks(cfg)}",
        "  captures",
    ]
    if not run.captures:
        lines.append("    (none)")
    for c in run.captures:
        row = f"    {c.label:40s} {str(c.shape):24s} {c.dtype:8s} {c.rows:7s} {human_bytes(c.nbytes):>10s}"
        if stats:
            s = block_stats(run.file[c.path])
            row += f"  mean {s['mean']:.4g} std {s['std']:.4g} min {s['min']:.4g} max {s['max']:.4g} zeros {s['zeros']:.1%}"
        lines.append(row)
    return "\n".join(lines)


def describe_sweep(sweep: Sweep) -> str:
    head = f"{sweep.folder}: {len(sweep.jobs)} jobs" + (f", swept: {', '.join(sweep.swept)}" if sweep.swept else "")
    return head + "\n" + str(sweep.table())


def _hooks(cfg: dict) -> str:
    hooks = cfg.get("hooks") or {}
    return ", ".join(f"{name} ({spec.get('type')} at {spec.get('at')})" for name, spec in hooks.items()) or "none"
