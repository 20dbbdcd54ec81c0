"""hookrun's EAP edges and faithfulness equal TransformerLens 4.3's `attribution_patch(granularity="edge")`
and `faithfulness` to 1e-4 on the same random-init HF GPT-2 (hookrun on the HF model itself, TransformerLens
on a TransformerBridge of it).

TransformerLens 4.3 cannot live beside 3.9 (which the other tests need): it is in a venv of its own,
made by `bash tests/envs/make_tl4.sh DIR`, whose python is named by $HOOKRUN_TL4_PYTHON (default
/opt/tl4/bin/python). The reference script tests/envs/tl4_edges.py runs there on the saved model and
a local word-level tokenizer and writes its scores to an .npz. Skipped only where that venv is missing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tl4_venv import needs_tl4, run_tl4, saved_word_gpt2

import hookrun

pytestmark = [pytest.mark.slow, needs_tl4]
KS = [0, 5, 40, 110]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2")
    model = saved_word_gpt2(d)
    spec = {"clean": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]],
            "corrupt": [[1, 2, 30, 4, 5, 6], [7, 8, 31, 10, 11, 12], [13, 14, 32, 16, 17, 18]],
            "answer": 3, "wrong": 30, "ks": KS}
    (d / "spec.json").write_text(json.dumps(spec))
    run_tl4("tl4_edges.py", d, d / "spec.json", d / "tl.npz")
    items = [{"input_ids": torch.tensor(c), "corrupt": torch.tensor(k), "answer": 3, "wrong": 30}
             for c, k in zip(spec["clean"], spec["corrupt"], strict=True)]
    return model, items, np.load(d / "tl.npz")


def test_eap_edges_equal_transformer_lens_4(saved):
    model, items, tl = saved
    got = hookrun.patch_grid(model, items, clean="input_ids", method="eap")["edges"]
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(tl["grid"]))
    np.testing.assert_allclose(got.values, tl["grid"], atol=1e-4, rtol=0)
    assert int(tl["n_edges"]) == int(np.isfinite(got.values).sum()) * 6  # TransformerLens' edges are per position


def test_faithfulness_equals_transformer_lens_4(saved):
    model, items, tl = saved
    got = hookrun.patch_grid(model, items[:1], clean="input_ids", method="eap", faithfulness={"edges": KS})["edges"]
    np.testing.assert_allclose(got.attrs["faithfulness_recovered"], tl["recovered"], atol=1e-4, rtol=0)
