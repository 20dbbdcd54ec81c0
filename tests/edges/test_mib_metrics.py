"""MIB's circuit metrics (faithfulness.fractions, CPR, CMD: edges/mib.py) against an independent
computation of MIB's definitions on the same TransformerLens 3.9 HookedTransformer and items.

The reference takes hookrun's written edge scores and nothing else from hookrun: it names the edges as
hannamw/EAP-IG's `Graph.from_model` does (input, a{l}.h{h}<q|k|v>, m{l}, logits), sizes the circuits
int(f * N), takes the top n by signed score (CPR) or |score| (CMD), prunes as EAP-IG's `prune` does
(over sets of node names), ablates every other edge with TransformerLens' own hooks (each reader's
input minus the ablated writers' live-minus-corrupted outputs, counterfactual ablation), normalises by
the clean run and the empty circuit, and integrates with numpy's trapezoid over the fractions. On a
model whose heads go through a post-attention norm (Gemma 2: TransformerLens' ln1_post), an ablated
head's layer enters a reader as ln1_post of the layer's heads with that reader's ablated ones
corrupted (plus b_O), in place of ln1_post of the live ones: EAP-IG's evaluate_graph, MIB's evaluation.
"""

# ruff: noqa: B023  (the reference hooks are closures used within the loop iteration that defines them)
from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_graph import prompt_pairs
from tl_models import hooked_transformer

import hookrun
from hookrun.errors import ConfigError

V, L, H, T = 40, 2, 4, 6
MIB = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@pytest.fixture(scope="module")
def model():
    return hooked_transformer(V, n_layers=L, d_model=16, n_ctx=8, d_head=4, n_heads=H, act_fn="gelu", seed=3)


@pytest.fixture(scope="module")
def items():
    return prompt_pairs(V, T, seed=5, at=1, shift=11)


def metric(logits, it):
    return float(logits[0, -1, it["answer"]] - logits[0, -1, it["wrong"]])


def eap_ig_edges():
    """EAP-IG's Graph.from_model edge list (non-parallel): (parent, child, qkv or None)."""
    edges, residual = [], ["input"]
    for layer in range(L):
        heads = [f"a{layer}.h{h}" for h in range(H)]
        edges += [(p, a, q) for p in residual for a in heads for q in "qkv"]
        residual += heads
        edges += [(p, f"m{layer}", None) for p in residual]
        residual.append(f"m{layer}")
    return edges + [(p, "logits", None) for p in residual]


def hookrun_label(edge):
    """hookrun's (writer, reader) of an EAP-IG edge."""
    def node(n):
        return "embed" if n == "input" else n if n == "logits" else (
            f"L{n[1:]}.MLP" if n[0] == "m" else "L{}.H{}".format(*n[1:].split(".h")))
    p, c, q = edge
    return node(p), node(c) + (f".{q}" if q else "")


def scores_of(grid):
    w, r = list(grid.writer.values), list(grid.reader.values)
    return {e: float(grid.values[w.index(a), r.index(b)]) for e in eap_ig_edges() for a, b in [hookrun_label(e)]}


def circuit(scores, n, absolute):
    """MIB's circuit: top n by score (or |score|), then EAP-IG's pruning until nothing changes."""
    ranked = sorted(scores, key=lambda e: abs(scores[e]) if absolute else scores[e], reverse=True)
    kept = set(ranked[:n])
    while True:
        outgoing = {p for p, _, _ in kept}
        incoming = {c for _, c, _ in kept} | {"input"}
        alive = outgoing & incoming
        pruned = {(p, c, q) for p, c, q in kept if p in alive and (c in alive or c == "logits")}
        if pruned == kept:
            return kept
        kept = pruned


def writer_outputs(model, ids):
    model.set_use_attn_result(True)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids[None])
    out = {"input": cache["hook_embed"][0]}
    for layer in range(L):
        for h in range(H):
            out[f"a{layer}.h{h}"] = cache[f"blocks.{layer}.attn.hook_result"][0, :, h]
        out[f"m{layer}"] = cache[f"blocks.{layer}.hook_mlp_out"][0]
    return out


def ablated_metric(model, items, kept, mean=False):
    """The metric averaged over items, every edge outside `kept` patched to its counterfactual value (`mean`:
    to each writer's output averaged over the items' corrupted inputs)."""
    ablated = [e for e in eap_ig_edges() if e not in kept]
    post = model.cfg.use_normalization_before_and_after
    values = []
    if mean:
        outs = [writer_outputs(model, it["corrupt"]) for it in items]
        averaged = {k: torch.stack([o[k] for o in outs]).mean(dim=0) for k in outs[0]}
    for it in items:
        corrupt, live = averaged if mean else writer_outputs(model, it["corrupt"]), {}

        def put(name):
            def hook(x, hook):
                if name == "heads":
                    for h in range(H):
                        live[f"a{hook.layer()}.h{h}"] = x[0, :, h]
                else:
                    live[name] = x[0]
            return hook

        def rebuild(child, qkv=None):
            def hook(x, hook):
                x = x.clone()
                for j, name in enumerate([f"{child}.h{h}" for h in range(H)] if qkv else [child]):
                    update, swapped = 0, {}  # swapped: layer -> its ablated heads' corrupt - live (post-norm models)
                    for p, c, q in ablated:
                        if q == qkv and c == name:
                            if post and p[0] == "a":
                                layer = int(p[1:].split(".")[0])
                                swapped[layer] = swapped.get(layer, 0) + corrupt[p] - live[p]
                            else:
                                update = update + corrupt[p] - live[p]
                    for layer, s in swapped.items():
                        blk = model.blocks[layer]
                        heads = sum(live[f"a{layer}.h{h}"] for h in range(H)) + blk.attn.b_O
                        update = update + blk.ln1_post(heads + s) - blk.ln1_post(heads)
                    if qkv:
                        x[0, :, j] += update
                    else:
                        x[0] += update
                return x
            return hook

        fwd = [("hook_embed", put("input"))]
        for layer in range(L):
            fwd += [(f"blocks.{layer}.hook_{q}_input", rebuild(f"a{layer}", q)) for q in "qkv"]
            fwd += [(f"blocks.{layer}.attn.hook_result", put("heads")), (f"blocks.{layer}.hook_mlp_in", rebuild(f"m{layer}")),
                    (f"blocks.{layer}.hook_mlp_out", put(f"m{layer}"))]
        fwd.append((f"blocks.{L - 1}.hook_resid_post", rebuild("logits")))
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
        model.cfg.ungroup_grouped_query_attention = True  # (grouped-query attention: a k and v input per query head)
        with torch.no_grad():
            values.append(metric(model.run_with_hooks(it["clean"][None], fwd_hooks=fwd), it))
    return float(np.mean(values))


def reference(model, items, scores, fractions, mean=False):
    """{"cpr"|"cmd": (faithfulness curve, kept counts, area)} by MIB's definitions."""
    n = len(scores)
    with torch.no_grad():
        clean = float(np.mean([metric(model(it["clean"][None]), it) for it in items]))
    empty = ablated_metric(model, items, set(), mean)  # (MIB: the empty circuit under the same ablation)
    trapezoid = getattr(np, "trapezoid", None) or np.trapz
    out = {}
    for name, absolute in (("cpr", False), ("cmd", True)):
        circuits = [circuit(scores, int(f * n), absolute) for f in fractions]
        faith = np.array([(ablated_metric(model, items, c, mean) - empty) / (clean - empty) for c in circuits])
        curve = faith if name == "cpr" else np.abs(1 - faith)
        out[name] = (faith, [len(c) for c in circuits], float(trapezoid(curve, fractions)))
    return out


def test_cpr_and_cmd_equal_mibs_definitions(model, items):
    grid = hookrun.patch_grid(model, items, input="input", method="eap_ig", ig_steps=2,
                              faithfulness={"fractions": "mib"})["edges"]
    scores = scores_of(grid)
    assert len(scores) == np.isfinite(grid.values).sum()  # the same edges as EAP-IG's graph
    want = reference(model, items, scores, MIB)
    assert grid.attrs["faithfulness_fractions"] == list(MIB)
    np.testing.assert_allclose(grid.attrs["faithfulness_cpr_curve"], want["cpr"][0], atol=2e-5)
    np.testing.assert_allclose(grid.attrs["faithfulness_cmd_curve"], want["cmd"][0], atol=2e-5)
    assert grid.attrs["faithfulness_cpr"] == pytest.approx(want["cpr"][2], abs=2e-5)
    assert grid.attrs["faithfulness_cmd"] == pytest.approx(want["cmd"][2], abs=2e-5)
    assert want["cpr"][1] != want["cmd"][1]  # the two rankings gave different circuits here


def test_mean_ablation_divides_by_the_empty_circuit_under_mean_ablation(model, items):
    """With ablation: mean, m(empty) was the corrupted run's metric: the empty circuit scored well above 0."""
    fractions = [0.05, 0.3, 1.0]
    grid = hookrun.patch_grid(model, items, input="input", method="eap",
                              faithfulness={"fractions": fractions, "ablation": "mean"})["edges"]
    want = reference(model, items, scores_of(grid), fractions, mean=True)
    np.testing.assert_allclose(grid.attrs["faithfulness_cpr_curve"], want["cpr"][0], atol=2e-5)
    np.testing.assert_allclose(grid.attrs["faithfulness_cmd_curve"], want["cmd"][0], atol=2e-5)
    assert grid.attrs["faithfulness_cpr"] == pytest.approx(want["cpr"][2], abs=2e-5)


def test_file_run_writes_inspects_and_plots_the_curves(model, items, tmp_path):
    fractions = [0.02, 0.1, 0.3, 1.0]
    path = tmp_path / "mib.h5"
    result = hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path), "overwrite": True},
                          "patching": {"method": "eap", "input": "input",
                                       "faithfulness": {"fractions": fractions, "edges": [5]}}},
                         model=model, dataset=items)
    run = hookrun.open_run(path)
    _, grid = run.edges()
    want = reference(model, items, scores_of(grid), fractions)
    mib = __import__("json").loads(run.attrs["patching"])["faithfulness"]["mib"]
    n = int(np.isfinite(grid.values).sum())
    assert mib["n_edges"] == n and mib["sizes"] == [int(f * n) for f in fractions]
    for name in ("cpr", "cmd"):
        assert mib[name]["kept"] == want[name][1]
        np.testing.assert_allclose(mib[name]["faithfulness"], want[name][0], atol=2e-5)
        assert mib[name]["area"] == pytest.approx(want[name][2], abs=2e-5)
    cpr, cmd = f"CPR {want['cpr'][2]:.4g}", f"CMD {want['cmd'][2]:.4g}"
    assert cpr in result.note and cmd in result.note and f"0.3: {want['cpr'][0][2]:.3g}" in result.note

    from hookrun.runner.kinds.patching.reader import grid_lines
    lines = "\n".join(grid_lines(run.attrs))
    assert cpr in lines and cmd in lines and f"0.1: {want['cmd'][0][1]:.3g}" in lines
    assert "recovered at k edges 5:" in lines
    from hookrun.runner.kinds.patching.reader import header_rows
    rows = {name: text for name, text in header_rows(run.attrs)}  # the report's run table
    assert rows["MIB"] == f"{cpr}, {cmd} over fractions of {n} edges" and "grid edges" in rows

    from hookrun.analysis.report.figure_specs import Lines
    from hookrun.runner.kinds.patching.report import plot_figures
    curves = [s for _, s in plot_figures(run) if isinstance(s, Lines)]
    mib_curve, = [c for c in curves if "CPR" in c.title]
    assert list(mib_curve.x) == fractions and mib_curve.log_x
    assert f"CPR {want['cpr'][2]:.3f}" in mib_curve.title and f"CMD {want['cmd'][2]:.3f}" in mib_curve.title
    np.testing.assert_allclose(mib_curve.series["signed ranking (CPR)"], want["cpr"][0], atol=2e-5)


@pytest.mark.parametrize("fractions", [[0.0, 0.5], [0.5, 1.5], "half", [], [True]])
def test_bad_fractions_one_line_before_any_forward(model, items, fractions):
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with pytest.raises(ConfigError, match=r"^patching.faithfulness.fractions=.*give mib .* in \(0, 1\]") as err:
            hookrun.patch_grid(model, items, input="input", method="eap", faithfulness={"fractions": fractions})
    finally:
        handle.remove()
    assert "\n" not in str(err.value) and not calls


@pytest.mark.parametrize(("change", "message"), [
    (lambda ids: ids.float(), r"^patching: the items' 'clean' are float32, and the model reads token ids through its embedding of 40"),
    (lambda ids: ids + V, r"^patching: item 0's 'clean' holds token id \d+, outside the model's vocabulary of 40 \(0..39\)"),
])
def test_token_ids_that_are_not_whole_or_past_the_vocabulary_are_one_line_before_any_forward(model, items, change, message):
    """The embedding's own IndexError or dtype RuntimeError came out with a traceback."""
    bad = [{**it, "clean": change(it["clean"])} for it in items]
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with pytest.raises(ConfigError, match=message):
            hookrun.patch_grid(model, bad, input="input", method="eap")
    finally:
        handle.remove()
    assert not calls


def test_faithfulness_by_edges_kept_is_drawn_on_a_numeric_axis():
    """0, 10, 50, 200, 479 edges kept were evenly spaced categories (whole numbers are categories):
    the curve's shape was the axis's. Now a numeric axis, symmetric-log (0 on it) in plot and report."""
    from types import SimpleNamespace

    pytest.importorskip("matplotlib")
    from hookrun.analysis.report.plotly_figures import to_plotly
    from hookrun.cli import figures
    from hookrun.runner.kinds.patching.report import _faithfulness

    k, rec = [0, 10, 50, 200, 479], [0.0, 0.4, 0.7, 0.9, 1.0]
    run = SimpleNamespace(attrs={"patching": __import__("json").dumps({"faithfulness": {"k": k, "recovered": rec, "from": "x"}})})
    (spec,) = _faithfulness(run)
    ax = figures.lines(spec).axes[0]
    assert ax.get_xscale() == "symlog"
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), np.array(k, dtype=float))
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), rec)
    fig = to_plotly(spec)
    (trace,) = fig["data"]
    assert fig["layout"]["xaxis"].get("type") != "category"
    np.testing.assert_allclose(trace["x"], np.log10(1 + np.array(k, dtype=float)))  # numpy's symmetric log of the counts
    assert list(trace["customdata"]) == k and list(trace["y"]) == rec
