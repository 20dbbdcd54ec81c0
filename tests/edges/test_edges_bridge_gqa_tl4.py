"""Edges on TransformerLens 4.3 TransformerBridges (hookrun run in the TL 4.3 venv: tests/envs/tl4_edges_bridge_gqa.py).

A bridge goes through the HookedTransformer route (its cfg, blocks and hook points); without grouping its grid
equals the one hookrun computes on the HF model itself. A bridge with grouped-query attention has no
`ungroup_grouped_query_attention` in its config, so its hook_k_input / hook_v_input are per key/value head and
cannot be made per query head, as the graph and MIB need: it is refused in one line, before any forward (it
ended in an AttributeError traceback from the config).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tl4_venv import needs_tl4, run_tl4

pytestmark = [pytest.mark.slow, needs_tl4]


def test_a_gqa_bridge_is_refused_in_one_line_and_a_plain_bridge_equals_the_hf_model(tmp_path):
    run_tl4("tl4_edges_bridge_gqa.py", tmp_path, tmp_path / "r.json", hookrun=True)
    got = json.loads((tmp_path / "r.json").read_text())
    plain = got["4"]
    np.testing.assert_allclose(plain["bridge"], plain["hf"], atol=1e-5, rtol=1e-4)
    gqa = got["2"]
    assert gqa["error"] == "ConfigError" and gqa["forwards"] == 0, gqa
    msg = gqa["message"]
    assert "grouped-query attention (2 key/value heads for 4 query heads)" in msg and "\n" not in msg, msg
    assert "no ungroup_grouped_query_attention" in msg and "give the HF model itself" in msg, msg
