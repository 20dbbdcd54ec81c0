"""faithfulness.from an edges run of another model whose graph has the same labels but other edges: a GPT-NeoX
run (attention and MLP in parallel: an MLP reads no head of its own layer) scoring a Llama of the same layer and
head counts, and the reverse. The run's file names every writer and reader the other model has, so only its
edges tell them apart; the reference is the residual stream's layer rules written in tests/helpers/edge_graph.py
(`feeds`), from which the edges one graph has and the other lacks are counted here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_graph import feeds, graph_labels, prompt_pairs
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

import hookrun
from hookrun.circuits import main
from hookrun.errors import ConfigError

V, L, H, T = 40, 2, 4, 6


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=V, hidden_size=32, num_hidden_layers=L, num_attention_heads=H,
                                            intermediate_size=64, max_position_embeddings=16, use_parallel_residual=True))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=L, num_attention_heads=H,
                                         num_key_value_heads=H, intermediate_size=64, max_position_embeddings=16))
    return {"neox": neox.eval(), "llama": llama.eval()}


@pytest.fixture(scope="module")
def items():
    return prompt_pairs(V, T, seed=1, at=2, shift=7, clean="input_ids")


def file_run(model, items, path):
    hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path), "overwrite": True},
                 "patching": {"method": "eap", "clean": "input_ids"}}, model=model, dataset=items)
    return path


@pytest.mark.parametrize("source, target", [("neox", "llama"), ("llama", "neox")])
def test_a_run_of_a_model_with_other_edges_is_one_line_before_any_forward(models, items, tmp_path, source, target):
    writers, readers = graph_labels(L, H)
    own = {(w, r) for w in writers for r in readers if feeds(w, r)}  # the sequential graph (Llama's)
    parallel = {(w, r) for w, r in own if not (w.startswith("L") and ".H" in w and r.endswith(".MLP")
                                                and w.split(".")[0] == r.split(".")[0])}
    assert len(own) - len(parallel) == L * H  # a parallel block's MLP reads none of its layer's heads
    path = file_run(models[source], items, tmp_path / f"{source}.h5")
    grid = hookrun.open_run(path).edges()[1]
    assert int(np.isfinite(grid.values).sum()) == len(parallel if source == "neox" else own)
    forwards = []
    handle = models[target].register_forward_pre_hook(lambda m, a: forwards.append(1))
    try:
        with pytest.raises(ConfigError) as info:
            hookrun.patch_grid(models[target], items, clean="input_ids", method="eap",
                               faithfulness={"edges": [5], "fractions": "mib", "from": str(path)})
    finally:
        handle.remove()
    msg = str(info.value)
    assert forwards == [] and "\n" not in msg, msg
    assert "patching.faithfulness.from=" in msg and "another model" in msg, msg
    assert "L0.H0 -> L0.MLP" in msg, msg  # the first edge one graph has and the other lacks
    counted = f"lacks {L * H} of this model's edges" if source == "neox" else f"scores {L * H} edges this model lacks"
    assert counted in msg, msg
    assert ("in parallel, this one in sequence" if source == "neox" else "in sequence, this one in parallel") in msg, msg


def test_a_run_whose_score_is_not_finite_is_one_line_naming_the_edge(models, items, tmp_path, capsys):
    """The same model's run with one edge's score not a finite number (a gradient that overflowed): that edge was
    ranked as a score of 0 without a word; now it is one line naming it, before any forward."""
    import h5py

    path = file_run(models["llama"], items, tmp_path / "llama.h5")
    with h5py.File(path, "r+") as f:
        cells = f["captures/patching/cells/value"]
        values = cells[...]
        first = int(np.flatnonzero(np.isfinite(values))[0])
        values[first] = np.nan
        cells[...] = values
    grid = hookrun.open_run(path).edges()[1]
    writers, readers = graph_labels(L, H)
    own = np.array([[feeds(w, r) for r in readers] for w in writers])
    lost = np.argwhere(own & ~np.isfinite(grid.values))
    assert len(lost) == 1  # the damaged cell is an edge of the graph
    w, r = writers[lost[0][0]], readers[lost[0][1]]
    with pytest.raises(ConfigError) as info:
        hookrun.patch_grid(models["llama"], items, clean="input_ids", method="eap", faithfulness={"edges": [5], "from": str(path)})
    msg = str(info.value)
    assert "\n" not in msg and "1 of its edges have no finite score" in msg and f"the first {w} -> {r} (nan)" in msg, msg
    out = tmp_path / "graph.json"  # `circuits export` left that edge out of EAP-IG's JSON without a word
    assert main(["export", str(path), "--format", "eap-ig", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert not out.exists() and "\n" not in err and f"the first {w} -> {r} (nan)" in err, err
