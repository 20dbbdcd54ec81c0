"""faithfulness.from and `circuits score --circuit` as users write them: a MIB folder by a bare relative name
(`sub`, as `circuits export ... --format mib sub` made it), a .pt circuit, items of token ids shaped [1, T],
and `circuits score` without --out.

The reference for the scores is MIB's definition as tests/edges/test_mib_metrics.py computes it (its own
ranking, pruning and raw TransformerLens ablation), fed the exported JSON's scores by EAP-IG edge name.
"""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pytest
from edge_graph import as_mib_model
from test_mib_metrics import T, eap_ig_edges, items, model, reference  # noqa: F401  (its module fixtures, built once here too)

import hookrun
from hookrun.circuits import main
from hookrun.errors import ConfigError

FRACTIONS = [0.01, 0.05, 0.2, 1.0]


def edge_key(name):
    """The reference's (parent, child, q|k|v or None) of an EAP-IG edge name 'P->C' or 'P->C<q>'."""
    parent, _, child = name.partition("->")
    base, _, q = child.partition("<")
    return parent, base, q.rstrip(">") or None


def counted(model):
    calls: list = []
    return calls, model.register_forward_pre_hook(lambda m, a: calls.append(1))


def test_mib_folder_by_a_bare_relative_name_is_scored(model, items, tmp_path, monkeypatch):
    """`sub` was refused ("choose from ... or a MIB folder"); ./sub and the absolute path were scored."""
    monkeypatch.chdir(tmp_path)
    hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": "run.h5", "overwrite": True},
                 "patching": {"method": "eap", "input": "input"}}, model=model, dataset=items)
    as_mib_model(monkeypatch, tmp_path / "run.h5")
    assert main(["export", "run.h5", "--format", "mib", "sub", "--task", "ioi", "--model", "gpt2"]) == 0
    doc = json.loads((tmp_path / "sub" / "ioi_gpt2" / "importances.json").read_text())
    scores = {edge_key(name): e["score"] for name, e in doc["edges"].items()}
    assert sorted(scores, key=str) == sorted(eap_ig_edges(), key=str)
    want = reference(model, items, scores, FRACTIONS)
    for source in ("sub", str(tmp_path / "sub")):
        grid = hookrun.patch_grid(model, items, input="input", method="eap",
                                  faithfulness={"fractions": FRACTIONS, "from": source})["edges"]
        np.testing.assert_allclose(grid.attrs["faithfulness_cpr_curve"], want["cpr"][0], atol=2e-5)
        np.testing.assert_allclose(grid.attrs["faithfulness_cmd_curve"], want["cmd"][0], atol=2e-5)
        assert grid.attrs["faithfulness_cpr"] == pytest.approx(want["cpr"][2], abs=2e-5)
        assert grid.attrs["faithfulness_cmd"] == pytest.approx(want["cmd"][2], abs=2e-5)


def test_a_method_name_wins_over_a_folder_of_that_name_and_a_missing_name_is_one_line(model, items, tmp_path, monkeypatch):
    from hookrun.runner.kinds.patching.edges.spec import parse_faithfulness

    monkeypatch.chdir(tmp_path)
    (tmp_path / "eap").mkdir()
    assert parse_faithfulness({"fractions": "mib", "from": "eap"}, "eap").source == "eap"
    assert parse_faithfulness({"fractions": "mib", "from": "./eap"}, "eap").source == "./eap"
    calls, handle = counted(model)
    try:
        with pytest.raises(ConfigError) as err:
            hookrun.patch_grid(model, items, input="input", method="eap", faithfulness={"fractions": "mib", "from": "nosuch"})
    finally:
        handle.remove()
    assert str(err.value) == ("patching.faithfulness.from='nosuch': no method and no file or folder of that name; choose from: "
                              "eap, eap_ig (this run's scoring), or the path of an edges run's file (.h5), an EAP-IG graph "
                              "JSON (.json) or a MIB folder whose scores rank the edges")
    assert not calls


def test_a_pt_circuit_is_named_as_such(model, items, tmp_path):
    """EAP-IG's Graph.to_pt file was called "not a readable HDF5 file", naming neither JSON nor a MIB folder."""
    (tmp_path / "c.pt").write_bytes(b"PK\x03\x04 a torch zip")
    calls, handle = counted(model)
    try:
        with pytest.raises(ConfigError) as err:
            hookrun.patch_grid(model, items, input="input", method="eap",
                               faithfulness={"fractions": "mib", "from": str(tmp_path / "c.pt")})
    finally:
        handle.remove()
    text = str(err.value)
    assert "\n" not in text and "HDF5" not in text and not calls
    assert "a .pt circuit (EAP-IG's Graph.to_pt) is not read; save the graph with EAP-IG's Graph.to_json" in text
    assert "an EAP-IG graph JSON (.json) or a MIB folder" in text


@pytest.mark.parametrize("method, sites", [("eap", None), ("exact", {"r": {"at": "blocks.*.hook_resid_pre", "over": ["position"]}})])
def test_items_of_shape_1_t_are_one_line_before_any_forward(model, items, method, sites):
    """Token ids of shape [1, T] per item (a tokenizer's return_tensors="pt") crashed inside the model after the
    forwards began (on an HF Llama: "too many values to unpack" in repeat_kv)."""
    bad = [{**it, "clean": it["clean"][None], "corrupt": it["corrupt"][None]} for it in items]
    calls, handle = counted(model)
    try:
        with pytest.raises(ConfigError) as err:
            hookrun.patch_grid(model, bad, input="input", method=method, sites=sites)
    finally:
        handle.remove()
    assert str(err.value) == (f"patching: the items' 'clean' have shape (1, {T}) each, and the model reads one sequence "
                              f"of token ids per item, shape (T,); give each item its 1-D ids (for a tokenizer's "
                              f"return_tensors='pt' output, ['input_ids'][0] or .squeeze(0))")
    assert not calls


def test_score_without_out_keeps_no_file(tmp_path, monkeypatch, capsys):
    """Every `circuits score` without --out left /tmp/hookrun_circuit_*/scored.h5 behind and printed its path."""
    cfg = {"model": {"_target_": "hookrun.models.tiny_lm"},
           "data": {"dataset": {"_target_": "hookrun.data.swaps.word_swap", "n": 2, "length": 8}, "target": None},
           "progress": False, "output": {"path": str(tmp_path / "run.h5"), "overwrite": True},
           "patching": {"input": "input_ids", "method": "eap", "faithfulness": {"fractions": FRACTIONS}}}
    hookrun.run(cfg)
    mib = json.loads(hookrun.open_run(tmp_path / "run.h5").attrs["patching"])["faithfulness"]["mib"]
    assert main(["export", str(tmp_path / "run.h5"), "--format", "eap-ig", str(tmp_path / "c.json")]) == 0
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (tempfile reads TMPDIR once, then caches it)
    capsys.readouterr()
    fr = ",".join(map(str, FRACTIONS))
    assert main(["score", str(tmp_path / "run.h5"), "--circuit", str(tmp_path / "c.json"), "--fractions", fr]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path / 'c.json'}: MIB CPR {mib['cpr']['area']:.4g}, "
                                                   f"CMD {mib['cmd']['area']:.4g}")
    assert not list(temp.iterdir())
    foreign = json.loads((tmp_path / "c.json").read_text())  # an error part-way: the folder goes as well
    foreign["nodes"]["a9.h0"] = {"in_graph": True}
    (tmp_path / "f.json").write_text(json.dumps(foreign))
    assert main(["score", str(tmp_path / "run.h5"), "--circuit", str(tmp_path / "f.json"), "--fractions", fr]) == 2
    assert "node 'a9.h0' is not in this model's graph" in capsys.readouterr().err
    assert not list(temp.iterdir())
