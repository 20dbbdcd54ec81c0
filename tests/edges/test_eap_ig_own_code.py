"""hookrun's EAP-IG scores and MIB's CPR / CMD against the reference implementations themselves, run here on the
same weights and items: hannamw/EAP-IG at the commit MIB-circuit-track pins as its submodule (7af394a5;
`attribute(..., 'EAP-IG-inputs')`, `Graph.from_json`) and MIB-circuit-track's `evaluate_area_under_curve` and
`logit_diff` (b759df34), from the repositories mirrored on this machine (skipped where they are not).

Their code is used as published but for two shims: EAP-IG's `tokenize_plus` (model.to_tokens of strings) is
given the items' token ids with their lengths, and its `device='cuda'` score buffers are put on the model's
device. EAP-IG's scores are hookrun's divided by the batch size (it averages a batch-mean metric's gradient and
divides by the item count again) and in MIB's loss sign, which is hookrun's denoising sign."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from edge_graph import prompt_pairs
from tl_models import hooked_transformer

import hookrun
from hookrun.circuits import main

EAP_IG = Path("/work/.mirror/hannamw+EAP-IG/repo")
MIB = Path("/work/.mirror/hannamw+MIB-circuit-track/repo")
pytestmark = pytest.mark.skipif(not (EAP_IG.is_dir() and MIB.is_dir()), reason="EAP-IG and MIB are not mirrored here")
V, T = 40, 6


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """EAP-IG's and MIB's modules, imported from their pinned commits."""
    pytest.importorskip("einops")
    root = tmp_path_factory.mktemp("ref")
    for repo, commit, path in ((EAP_IG, "7af394a5662de8b23ad6154716a0cd3993d447a3", "src/eap"),
                               (MIB, "b759df34433c9e31043ba9e02908ce0bf20e894f", "MIB_circuit_track")):
        tar = subprocess.run(["git", "--git-dir", str(repo), "archive", commit, path], capture_output=True, check=True).stdout
        tarfile.open(fileobj=io.BytesIO(tar)).extractall(root, filter="data")
    attribute = root / "src/eap/attribute.py"
    attribute.write_text(attribute.read_text().replace("device='cuda'", "device=model.cfg.device"))
    sys.path[:0] = [str(root / "src"), str(root)]
    import eap.attribute
    import eap.evaluate
    import eap.utils
    from eap.graph import Graph
    from MIB_circuit_track.evaluation import evaluate_area_under_curve
    from MIB_circuit_track.metrics import logit_diff

    def tokenize_plus(model, inputs, max_length=None):  # (the items' ids and real lengths, right-padded)
        ids = torch.stack([x for x, _ in inputs])
        n = torch.tensor([n for _, n in inputs])
        return ids, (torch.arange(ids.shape[1])[None] < n[:, None]).long(), n, ids.shape[1]
    for module in (eap.utils, eap.attribute, eap.evaluate):
        module.tokenize_plus = tokenize_plus
    yield {"attribute": eap.attribute.attribute, "Graph": Graph, "auc": evaluate_area_under_curve, "logit_diff": logit_diff}
    sys.path[:] = [p for p in sys.path if not p.startswith(str(root))]
    for name in [m for m in sys.modules if m == "eap" or m.startswith(("eap.", "MIB_circuit_track"))]:
        del sys.modules[name]


def model_and_items(kv, rotary):
    extra = {"n_key_value_heads": kv} if kv else {}
    if rotary:
        extra.update(positional_embedding_type="rotary", normalization_type="RMS", rotary_dim=4, gated_mlp=True, d_mlp=32)
    model = hooked_transformer(V, n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=4, seed=3,
                               **{"act_fn": "silu" if rotary else "gelu", **extra})
    items = prompt_pairs(V, T, seed=5, at=1, shift=11, n=4)
    for it, n in zip(items, (6, 4, 5, 3), strict=True):  # (right-padded, the metric at each item's last real token)
        for key in ("clean", "corrupt"):
            it[key] = it[key].clone()
            it[key][n:] = 0
        it["position"] = torch.tensor(n - 1)
    return model, items


def mib_model(model):
    for key in ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in", "ungroup_grouped_query_attention"):
        setattr(model.cfg, key, True)
    model.setup()
    return model


def loader(items):
    def rows(key):
        return [(it[key], int(it["position"]) + 1) for it in items]
    return [(rows("clean"), rows("corrupt"), [[it["answer"], it["wrong"]] for it in items])]


def hookrun_label(node):
    if node == "input":
        return "embed"
    if node == "logits":
        return node
    return f"L{node[1:]}.MLP" if node[0] == "m" else "L{}.H{}".format(*node[1:].split(".h"))


@pytest.mark.parametrize(("kv", "rotary"), [(None, False), (2, False), (1, True), (2, True)])
def test_scores_and_areas_equal_eap_igs_and_mibs_own(ref, tmp_path, kv, rotary):
    model, items = model_and_items(kv, rotary)
    path = tmp_path / "edges.h5"
    hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path)},
                 "patching": {"method": "eap_ig", "ig_steps": 5, "input": "input",
                              "metric": {"name": "logit_diff", "position": "position"},
                              "faithfulness": {"fractions": "mib"}}}, model=model, dataset=items)
    with hookrun.open_run(path) as run:
        grid = run.edges(top=0)[1]
        mib = json.loads(run.attrs["patching"])["faithfulness"]["mib"]
    assert main(["export", str(path), "--format", "eap-ig", str(tmp_path / "graph.json")]) == 0

    model = mib_model(model)
    graph = ref["Graph"].from_model(model)
    ref["attribute"](model, graph, loader(items), partial(ref["logit_diff"], mean=True, loss=True), "EAP-IG-inputs",
                     "patching", ig_steps=5, quiet=True)
    w, r = list(grid.writer.values), list(grid.reader.values)
    theirs, ours = [], []
    for name, edge in graph.edges.items():
        parent, _, child = name.partition("->")
        base, _, qkv = child.partition("<")
        ours.append(grid.values[w.index(hookrun_label(parent)), r.index(hookrun_label(base) + (f".{qkv[0]}" if qkv else ""))])
        theirs.append(edge.score * len(items))
    assert len(ours) == np.isfinite(grid.values).sum()  # (the same edges)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * np.max(np.abs(ours)))

    for key, absolute in (("cpr", False), ("cmd", True)):  # MIB's run_evaluation: CPR signed, CMD with --absolute
        graph = ref["Graph"].from_json(str(tmp_path / "graph.json"))
        _, under, from_1, _, faith = ref["auc"](model, graph, loader(items), partial(ref["logit_diff"], mean=False, loss=False),
                                                quiet=True, absolute=absolute)
        np.testing.assert_allclose(mib[key]["faithfulness"], faith, atol=1e-5)
        assert mib[key]["area"] == pytest.approx(under if key == "cpr" else from_1, abs=1e-5)
