"""benchmarks/mib_table.py --quick (the table of docs/edges.md: MIB's CPR and CMD of each edge ranking on the
shipped task) runs from a fresh checkout and reports every row; its atp_ig identity check is small."""

from __future__ import annotations

import re

import pytest
from test_benchmarks import quick


@pytest.mark.slow
def test_mib_table_quick_mode_reports_every_ranking(tmp_path):
    table = quick(tmp_path, "mib_table.py")
    rows = {}
    for name in ("eap", "eap_ig (m = 2)", "atp_ig node scores (m = 2), each edge its writer's",
                 "exact (each edge's own effect)", "random (Gaussian, seed 0)"):
        m = re.search(rf"^\| {re.escape(name)} \| ([-\d.]+) \| ([-\d.]+) \|", table, re.M)
        assert m is not None, name
        rows[name] = (float(m.group(1)), float(m.group(2)))
    assert "479 edges" in table
    gap = float(re.search(r"by at most ([-\de.+]+)", table).group(1))
    assert gap < 1e-4  # a node's AtP-IG score is the sum of its outgoing EAP-IG edges
    # the exact ranking's circuits recover the most; random scores' the least
    assert rows["exact (each edge's own effect)"][0] > rows["random (Gaussian, seed 0)"][0]
    assert rows["exact (each edge's own effect)"][1] < rows["random (Gaussian, seed 0)"][1]
