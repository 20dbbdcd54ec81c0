"""benchmarks/edges_tl4.py --quick: hookrun's EAP against TransformerLens 4.3's attribution_patch(granularity="edge")
runs from a fresh checkout, and the two agree on every edge (the time ratio is the benchmark's figure, not
checked on a shared CI machine). Skipped where the TransformerLens 4.3 venv is missing (tests/envs/make_tl4.sh)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_benchmarks import quick

TL4 = os.environ.get("HOOKRUN_TL4_PYTHON", "/opt/tl4/bin/python")


@pytest.mark.slow
@pytest.mark.skipif(not Path(TL4).exists(), reason=f"no TransformerLens 4.3 venv at {TL4}")
def test_edges_tl4_quick_mode_times_both_on_equal_scores(tmp_path):
    table = quick(tmp_path, "edges_tl4.py")
    assert '| hookrun eap / TransformerLens 4.3 attribution_patch(granularity="edge") (time, 2 pairs) |' in table
    row = next(line for line in table.splitlines() if line.startswith("| largest abs(hookrun - TransformerLens)"))
    assert row.split(" | ")[3] == "yes" and "479 edges" in row
