"""Text views of a run and a sweep, as `python -m hookrun.inspect` prints them."""

from __future__ import annotations

from hookrun.analysis.sweep import Sweep


def describe_sweep(sweep: Sweep) -> str:
    head = f"{sweep.folder}: {len(sweep.jobs)} jobs" + (f", swept: {', '.join(sweep.swept)}" if sweep.swept else "")
    return head + "\n" + str(sweep.table())
