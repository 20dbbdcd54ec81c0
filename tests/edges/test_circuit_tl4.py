"""A circuit scored by TransformerLens 4.3 (`attribution_patch(granularity="edge")`, its edge scores saved as
JSON records) imported by `faithfulness.from`: hookrun's recovered fractions of its top-k circuits equal
TransformerLens' own `faithfulness` of the same circuits, on the same random-init HF GPT-2 (hookrun on the HF
model, TransformerLens on a TransformerBridge of it, in its own venv: see tests/edges/test_edges_tl4.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tl4_venv import needs_tl4, run_tl4, saved_word_gpt2

import hookrun
from hookrun.errors import ConfigError

pytestmark = [pytest.mark.slow, needs_tl4]
KS = [0, 5, 40, 110]


def test_transformer_lens_circuit_scored_as_transformer_lens_scores_it(tmp_path):
    model = saved_word_gpt2(tmp_path)
    spec = {"clean": [[1, 2, 3, 4, 5, 6]], "corrupt": [[1, 2, 30, 4, 5, 6]], "answer": 3, "wrong": 30, "ks": KS}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run_tl4("tl4_edge_scores.py", tmp_path, tmp_path / "spec.json", tmp_path / "tl.json")
    tl = json.loads((tmp_path / "tl.json").read_text())
    items = [{"input_ids": torch.tensor(spec["clean"][0]), "corrupt": torch.tensor(spec["corrupt"][0]), "answer": 3, "wrong": 30}]
    got = hookrun.patch_grid(model, items, clean="input_ids", method="eap",
                             faithfulness={"edges": KS, "from": str(tmp_path / "tl.json")})["edges"]
    np.testing.assert_allclose(got.attrs["faithfulness_recovered"], tl["recovered"], atol=1e-4, rtol=0)

    tl["edge_scores"] = [r for r in tl["edge_scores"] if not (r["writer"]["kind"] == "mlp_out" and r["reader"]["kind"] == "logits")]
    (tmp_path / "part.json").write_text(json.dumps(tl))
    with pytest.raises(ConfigError, match=r"edge L\d.MLP -> logits is missing"):
        hookrun.patch_grid(model, items, clean="input_ids", method="eap", faithfulness={"edges": KS, "from": str(tmp_path / "part.json")})
