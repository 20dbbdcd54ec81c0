"""Circuits exchanged with other tools (edges/formats.py, `python -m hookrun.circuits`): EAP-IG's graph
JSON and MIB's submission folder, written from an edges run and read back by `faithfulness.from`.

The expected names are written here from hannamw/EAP-IG's `Graph.from_model` (nodes input, a{l}.h{h},
m{l}, logits; an edge into a head per q, k, v input, named P->a{l}.h{h}<q>); an imported circuit's
scores are checked against the MIB reference of tests/edges/test_mib_metrics.py (its own ranking, pruning
and raw TransformerLens ablation), fed the same scores by EAP-IG edge name.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from edge_graph import as_mib_model, prompt_pairs
from test_mib_metrics import eap_ig_edges, reference
from tl_models import hooked_transformer
from warm_python import python as warm

import hookrun
from hookrun.circuits import main
from hookrun.errors import ConfigError

V, T = 40, 6


def make_items(seed=7):
    return prompt_pairs(V, T, seed=seed, at=1, shift=11)


def edges_run(model, items, path, **faith):
    block = {"method": "eap", "input": "input", **({"faithfulness": faith} if faith else {})}
    hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path), "overwrite": True},
                 "patching": block}, model=model, dataset=items)
    return hookrun.open_run(path)


def expected_names(n_layers, n_heads):
    """EAP-IG's Graph.from_model for a GPT-2-shaped (non-parallel) model: its node and edge names."""
    nodes, edges, residual = ["input"], [], ["input"]
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        nodes += heads + [f"m{layer}"]
        edges += [f"{p}->{a}<{q}>" for p in residual for a in heads for q in "qkv"]
        residual += heads
        edges += [f"{p}->m{layer}" for p in residual]
        residual.append(f"m{layer}")
    edges += [f"{p}->logits" for p in residual]
    return nodes + ["logits"], edges


def test_eap_ig_json_has_eap_igs_names_and_round_trips(tmp_path, capsys, monkeypatch):
    model = hooked_transformer(V, n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=2, act_fn="gelu", seed=1)
    run = edges_run(model, make_items(), tmp_path / "edges.h5")
    _, grid = run.edges()
    assert main(["export", str(tmp_path / "edges.h5"), "--format", "eap-ig", str(tmp_path / "graph.json")]) == 0
    doc = json.loads((tmp_path / "graph.json").read_text())
    nodes, edges = expected_names(2, 2)
    assert doc["cfg"] == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16}
    assert list(doc["nodes"]) == nodes and sorted(doc["edges"]) == sorted(edges) and len(edges) == len(set(edges))
    assert len(edges) == np.isfinite(grid.values).sum()
    w, r = list(grid.writer.values), list(grid.reader.values)
    assert doc["edges"]["a0.h1->a1.h0<k>"]["score"] == grid.values[w.index("L0.H1"), r.index("L1.H0.k")]
    assert doc["edges"]["m0->logits"]["score"] == grid.values[w.index("L0.MLP"), r.index("logits")]
    assert doc["edges"]["input->m1"]["score"] == grid.values[w.index("embed"), r.index("L1.MLP")]
    assert all(e["in_graph"] for e in doc["edges"].values())

    from hookrun.runner.kinds.patching.edges.formats import read_circuit
    from hookrun.runner.kinds.patching.edges.graph import Graph

    g = Graph(2, 2)
    back = read_circuit(tmp_path / "graph.json", g.writers, g.readers, g.mask)
    np.testing.assert_array_equal(back, grid.values)  # NaN where no edge, every score equal

    as_mib_model(monkeypatch, tmp_path / "edges.h5")
    assert main(["export", str(tmp_path / "edges.h5"), "--format", "mib", str(tmp_path / "sub"), "--task", "ioi",
                 "--model", "gpt2", "--fraction", "0.1"]) == 0
    mib = tmp_path / "sub" / "ioi_gpt2" / "importances.json"
    assert mib.is_file() and "wrote" in capsys.readouterr().out
    np.testing.assert_array_equal(read_circuit(tmp_path / "sub", g.writers, g.readers, g.mask), grid.values)
    kept = json.loads(mib.read_text())["edges"]
    assert sum(e["in_graph"] for e in kept.values()) <= int(0.1 * len(edges))
    # a fraction that keeps no edge (MIB's count, int(fraction x edges)) wrote an empty circuit said as any other
    low = 0.5 / len(edges)
    assert main(["export", str(tmp_path / "edges.h5"), "--format", "mib", str(tmp_path / "none"), "--task", "ioi",
                 "--model", "gpt2", "--fraction", str(low)]) == 2
    assert f"--fraction {low} keeps no edge of the run's {len(edges)}" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_imported_circuit_scored_as_mib_scores_it(tmp_path):
    """Random importance scores by EAP-IG edge name, in a MIB folder: hookrun's CPR / CMD from that folder
    equal the reference's from the same scores."""
    model = hooked_transformer(V, n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=4, act_fn="gelu", seed=3)
    items = make_items(5)
    rng = np.random.default_rng(0)
    scores = {e: float(rng.normal()) for e in eap_ig_edges()}
    folder = tmp_path / "sub" / "ioi_tiny"
    folder.mkdir(parents=True)
    nodes = ["input"] + [f"a{l}.h{h}" for l in range(2) for h in range(4)] + ["m0", "m1", "logits"]  # noqa: E741
    edge_name = lambda p, c, q: f"{p}->{c}" + (f"<{q}>" if q else "")  # noqa: E731
    (folder / "importances.json").write_text(json.dumps({
        "cfg": {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 16},
        "nodes": {n: {"in_graph": True} for n in nodes},
        "edges": {edge_name(*e): {"score": s, "in_graph": True} for e, s in scores.items()}}))
    fractions = [0.01, 0.05, 0.2, 1.0]
    grid = hookrun.patch_grid(model, items, input="input", method="eap",
                              faithfulness={"fractions": fractions, "from": str(tmp_path / "sub")})["edges"]
    want = reference(model, items, scores, fractions)
    assert grid.attrs["faithfulness_cpr"] == pytest.approx(want["cpr"][2], abs=2e-5)
    assert grid.attrs["faithfulness_cmd"] == pytest.approx(want["cmd"][2], abs=2e-5)
    np.testing.assert_allclose(grid.attrs["faithfulness_cpr_curve"], want["cpr"][0], atol=2e-5)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["nodes"].update({"a5.h0": {"in_graph": True}}), "node 'a5.h0' is not in this model's graph"),
    (lambda d: d["edges"].pop("m0->logits"), "edge 'm0->logits' is missing"),
    (lambda d: d["edges"].update({"m1->m0": {"score": 1.0, "in_graph": True}}),  # (it named node m0 as not there)
     "edge 'm1->m0' is not in this model's graph (both nodes are, but no edge runs from 'm1' to 'm0'"),
    (lambda d: d["edges"]["m0->logits"].update(score=float("nan")),  # (it said the edge is missing)
     "edge 'm0->logits' has no finite number as its score (nan)"),
    (lambda d: d.pop("edges"), "unknown circuit format"),
])
def test_foreign_circuits_are_one_line(tmp_path, change, message):
    from hookrun.runner.kinds.patching.edges.formats import read_circuit, to_eap_ig
    from hookrun.runner.kinds.patching.edges.graph import Graph

    g = Graph(2, 2)
    scores = np.where(g.mask, 1.0, np.nan)
    doc = to_eap_ig(g.writers, g.readers, scores, {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 8})
    change(doc)
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        read_circuit(tmp_path / "c.json", g.writers, g.readers, g.mask)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fmt", ["eap-ig", "mib"])
def test_an_export_that_fills_the_disk_leaves_the_earlier_file_whole(tmp_path, capsys, monkeypatch, fmt):
    """A write stopped part-way (ENOSPC after half the JSON) left a cut-off graph under the final name,
    which EAP-IG's Graph.from_json and `faithfulness.from` then failed to parse; the earlier export stays."""
    import errno
    from pathlib import Path

    model = hooked_transformer(V, n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=2, act_fn="gelu", seed=1)
    edges_run(model, make_items(), tmp_path / "edges.h5")
    args = ["export", str(tmp_path / "edges.h5"), "--format", fmt, str(tmp_path / "out")]
    args += ["--task", "ioi", "--model", "gpt2"] if fmt == "mib" else []
    as_mib_model(monkeypatch, tmp_path / "edges.h5")
    assert main(args) == 0
    written = next(p for p in (tmp_path / "out").rglob("*") if p.is_file()) if fmt == "mib" else tmp_path / "out"
    before = json.loads(written.read_text())
    real = Path.write_text

    def full(self, text, *a, **k):  # half the JSON reaches the disk, then it is full
        real(self, text[: len(text) // 2], *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    assert main(args) == 2
    assert "cannot write (No space left on device)" in capsys.readouterr().err
    monkeypatch.undo()
    assert json.loads(written.read_text()) == before
    assert not [p.name for p in written.parent.iterdir() if p.name.endswith(".tmp")]  # (nor a temporary left)


def test_bad_export_arguments_are_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "none.h5"), "--format", "circuitsvis", str(tmp_path / "x")]) == 2
    assert "--format 'circuitsvis'; choose from: mib, eap-ig" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "none.h5"), "--format", "mib", str(tmp_path / "x")]) == 2
    assert "needs --task and --model" in capsys.readouterr().err

    config = tmp_path / "sae.yaml"  # another kind's config: named, not blamed on a pairing the user never asked for
    config.write_text("model: {_target_: hookrun.models.tiny_lm}\nsae: {from: cache, at: h.0}\n")
    assert main(["score", str(config), "--circuit", str(tmp_path / "g.json")]) == 2
    assert ("sae.yaml: its config (a run of kind sae) has no patching block to score the circuit on; give an edges "
            "run's file (patching method eap or eap_ig) or a YAML config with one") in capsys.readouterr().err


@pytest.mark.slow
def test_cli_run_export_and_score_agree(tmp_path, monkeypatch):
    """experiment=faithfulness with MIB's fractions: its last log line says CPR and CMD; its scores exported
    as a MIB folder and scored again by `python -m hookrun.circuits score` give the same curve."""

    from conftest import ROOT, run_cli

    pytest.importorskip("transformers")
    proc = run_cli("experiment=faithfulness", f"hydra.run.dir={tmp_path}", "patching.ig_steps=2", "device=cpu", "progress=false",
                   "data.dataset.n=2", "data.dataset.length=8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    mib = json.loads(hookrun.open_run(tmp_path / "captures.h5").attrs["patching"])["faithfulness"]["mib"]
    last = (proc.stdout or proc.stderr).strip().splitlines()[-1]
    assert f"CPR {mib['cpr']['area']:.4g}, CMD {mib['cmd']['area']:.4g}" in last and "0.5: " in last
    as_mib_model(monkeypatch, tmp_path / "captures.h5")
    assert main(["export", str(tmp_path / "captures.h5"), "--format", "mib", str(tmp_path / "sub"), "--task", "ioi",
                 "--model", "gpt2"]) == 0
    scored = warm(["-m", "hookrun.circuits", "score", str(tmp_path / "captures.h5"), "--circuit",
                   str(tmp_path / "sub"), "--out", str(tmp_path / "scored.h5")],
                  cwd=ROOT, timeout=600)
    assert scored.returncode == 0, scored.stderr[-2000:]
    again = json.loads(hookrun.open_run(tmp_path / "scored.h5").attrs["patching"])["faithfulness"]["mib"]
    np.testing.assert_allclose(again["cpr"]["faithfulness"], mib["cpr"]["faithfulness"], atol=1e-6)
    assert again["cmd"]["kept"] == mib["cmd"]["kept"] and f"CPR {mib['cpr']['area']:.4g}" in scored.stdout


def test_score_on_a_run_of_python_objects_and_bad_fractions_say_what_to_give(tmp_path, capsys):
    """A run made with hookrun.run(cfg, model=..., dataset=...) said "model: expected a node with _target_ ...,
    got {'live': ...}"; --fractions 0,2 was named as patching.faithfulness.fractions, a key the user never typed."""
    import torch

    path = tmp_path / "live.h5"
    hookrun.run({"hooks": {"l": {"at": "", "type": "forward"}}, "progress": False, "output": {"path": str(path)}},
                model=torch.nn.Linear(3, 2), dataset=[(torch.ones(3), 0)] * 2)
    assert main(["score", str(path), "--circuit", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "the run was given Python objects (model torch.nn.modules.linear.Linear, data.dataset builtins.list)" in err
    assert "give a YAML config that builds them, or score in Python with hookrun.patch_grid" in err
    assert main(["score", str(path), "--circuit", str(tmp_path / "c.json"), "--fractions", "0,2"]) == 2
    err = capsys.readouterr().err
    assert "--fractions 0,2: give mib" in err and "patching.faithfulness" not in err, err
