"""benchmarks/sae_train.py runs from a fresh install (its figures are in docs/benchmarks.md; timings
on a shared CI machine prove nothing, so this checks only that every route runs and is reported)."""

from __future__ import annotations

import pytest
from bench_quick import quick


@pytest.mark.slow
def test_sae_train_benchmark_quick_mode_runs_every_route(tmp_path):
    pytest.importorskip("sae_lens")
    table = quick(tmp_path, "sae_train.py")
    for row in ("rows/s: hookrun from a local cache / SAELens from memory |",
                "peak RSS: 10x the cache's rows / 1x (hookrun) |",
                "rows/s: hookrun from SeaweedFS (s3://) / SAELens from memory |", "sae-lens ", "load average"):
        assert row in table, (row, table)
    assert "| not run |" not in table  # the dev extras install the `weed` binary: the s3:// route runs
