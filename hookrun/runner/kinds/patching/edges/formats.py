"""Edge scores in other tools' files: hannamw/EAP-IG's graph JSON, MIB's submission folder and
TransformerLens 4.3's edge scores.

    doc = to_eap_ig(writers, readers, scores, cfg={"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 16})
    path = write_mib(doc, "outputs/mib", task="ioi", model="gpt2")   # outputs/mib/ioi_gpt2/importances.json
    scores = read_circuit("outputs/mib/ioi_gpt2", writers, readers)   # [writers, readers], NaN where no edge

EAP-IG's `Graph.to_json` / `from_json` (hannamw/EAP-IG, src/eap/graph.py): `{"cfg": {n_layers, n_heads,
parallel_attn_mlp, d_model}, "nodes": {name: {"in_graph", "score"}}, "edges": {"P->C": {"score",
"in_graph"}}}`. Its nodes are hookrun's: `input` (embed), `a{l}.h{h}` (L{l}.H{h}), `m{l}` (L{l}.MLP) and
`logits`; an edge into a head names the head's input it enters, `a0.h1->a1.h0<q>` (hookrun's reader
L1.H0.q). MIB's circuit track reads a folder per task and model, `{task}_{model}/importances.json`
(MIB-circuit-track's README and run_evaluation.py), each that JSON with importance scores.
TransformerLens 4.3's `attribution_patch(granularity="edge")` scores (writer, reader) node pairs per
position; its JSON here is the list `[{"writer": asdict(w), "reader": asdict(r), "score": s} for (w, r), s in
result.edge_scores.items()]` (or {"edge_scores": that list}), read summed over positions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hookrun.errors import ConfigError, close_matches
from hookrun.store.whole_file import write_whole

FORMATS = ("mib", "eap-ig")
# The submission folders MIB's circuit track scores: run_evaluation.py skips, without a word, a folder
# `{task.replace('_', '-')}_{model}` that is not a key of COL_MAPPING (hannamw/MIB-circuit-track,
# MIB_circuit_track/utils.py at commit b759df34433c9e31043ba9e02908ce0bf20e894f).
MIB_FOLDERS = ("ioi_gpt2", "ioi_qwen2.5", "ioi_gemma2", "ioi_llama3", "mcqa_qwen2.5", "mcqa_gemma2", "mcqa_llama3",
               "arithmetic-addition_llama3", "arithmetic-subtraction_llama3", "arc-easy_gemma2", "arc-easy_llama3",
               "arc-challenge_llama3", "ioi_interpbench")
# The shape of each model MIB scores (its graph: layers, query heads, the residual width; no parallel blocks), which
# run_evaluation.py loads by name (MODEL_NAME_TO_FULLNAME: gpt2-small, Qwen/Qwen2.5-0.5B, google/gemma-2-2b,
# meta-llama/Llama-3.1-8B, their published configs; InterpBench's IOI model: the 6 layers and 4 heads of MIB's
# attribute_interpbench.ipynb's graph, its width not published there). Key and value heads are ungrouped (MIB's
# ungroup_grouped_query_attention): a reader per query head, so the kv head count does not change the graph.
MIB_SHAPES = {"gpt2": (12, 12, 768), "qwen2.5": (24, 14, 896), "gemma2": (26, 8, 2304), "llama3": (32, 32, 4096),
              "interpbench": (6, 4, None)}
_HEAD = re.compile(r"^L(\d+)\.H(\d+)$")
_READER_HEAD = re.compile(r"^L(\d+)\.H(\d+)\.([qkv])$")
_MLP = re.compile(r"^L(\d+)\.MLP$")


def node_name(label: str) -> str:
    """EAP-IG's node of a hookrun writer (or of the MLP / logits reader)."""
    if label == "embed":
        return "input"
    if label == "logits":
        return label
    if m := _HEAD.match(label):
        return f"a{m[1]}.h{m[2]}"
    if m := _MLP.match(label):
        return f"m{m[1]}"
    raise ValueError(f"no EAP-IG node for {label!r}")


def child_name(reader: str) -> str:
    """The child part of EAP-IG's edge name for a hookrun reader: `a1.h0<q>`, `m1`, `logits`."""
    if m := _READER_HEAD.match(reader):
        return f"a{m[1]}.h{m[2]}<{m[3]}>"
    return node_name(reader)


def edge_names(writers: Sequence[str], readers: Sequence[str]) -> list[list[str]]:
    """[writers][readers] EAP-IG edge names ('P->C' or 'P->C<q>')."""
    children = [child_name(r) for r in readers]
    return [[f"{node_name(w)}->{c}" for c in children] for w in writers]


def to_eap_ig(writers: Sequence[str], readers: Sequence[str], scores: np.ndarray, cfg: dict,
              in_graph: np.ndarray | None = None) -> dict:
    """EAP-IG's graph JSON of a [writers, readers] grid (NaN: no edge). `in_graph`: the circuit's edges
    ([writers, readers] bool; every edge where None); a node is in the graph where it has a kept edge."""
    mask = np.isfinite(scores)
    keep = mask if in_graph is None else (np.asarray(in_graph, dtype=bool) & mask)
    names = edge_names(writers, readers)
    nodes: dict = {}
    for i, w in enumerate(writers):
        nodes[node_name(w)] = {"in_graph": bool(keep[i].any()) or (in_graph is None),
                               "score": float(np.nansum(scores[i]))}
    edges = {names[i][j]: {"score": float(scores[i, j]), "in_graph": bool(keep[i, j])}
             for i in range(len(writers)) for j in range(len(readers)) if mask[i, j]}
    nodes["logits"] = {"in_graph": True}
    return {"cfg": dict(cfg), "nodes": nodes, "edges": edges}


def mib_folder(task: str, model: str) -> str:
    """MIB's folder name `{task}_{model}` (a task's `_` written `-`, as MIB writes it), refused in one line where
    MIB's circuit track would skip it (MIB_FOLDERS), with the closest name it scores."""
    tasks = list(dict.fromkeys(f.rpartition("_")[0] for f in MIB_FOLDERS))
    models = list(dict.fromkeys(f.rpartition("_")[2] for f in MIB_FOLDERS))
    name = task.replace("_", "-")
    for flag, given, choices in (("--task", name, tasks), ("--model", model, models)):
        if given not in choices:
            near = close_matches(given, choices, n=1)
            raise ConfigError(f"{flag} {given!r}: not one of MIB's (its run_evaluation.py would skip the folder without "
                              f"scoring it); {f'did you mean {near[0]}? ' if near else ''}choose from: {', '.join(choices)}")
    if f"{name}_{model}" not in MIB_FOLDERS:
        scored = [f.rpartition("_")[2] for f in MIB_FOLDERS if f.rpartition("_")[0] == name]
        raise ConfigError(f"--task {name} --model {model}: MIB scores no {name}_{model} folder (its run_evaluation.py "
                          f"would skip it without scoring it); MIB scores {name} on: {', '.join(scored)}")
    return f"{name}_{model}"


def check_mib_shape(cfg: dict, model: str) -> None:
    """A run's graph (EAP-IG's cfg) exported under one of MIB's model names must have that model's shape: MIB's
    evaluation builds the graph from the file's cfg and runs it on its own model of that name."""
    want = MIB_SHAPES.get(model)
    if want is None:
        return
    layers, heads, width = want
    have = (int(cfg["n_layers"]), int(cfg["n_heads"]), int(cfg.get("d_model") or 0) or None)
    wrong = (have[0] != layers or have[1] != heads or bool(cfg.get("parallel_attn_mlp"))
             or (width is not None and have[2] is not None and have[2] != width))
    if wrong:
        def shape(n_layers, n_heads, d_model, parallel=False):
            return (f"{n_layers} layers, {n_heads} heads" + (f", d_model {d_model}" if d_model else "")
                    + (", parallel attention and MLP" if parallel else ""))
        fits = [m for m, (n, h, w) in MIB_SHAPES.items() if (n, h) == have[:2] and (w is None or have[2] in (None, w))]
        raise ConfigError(f"--model {model}: the run's graph ({shape(*have, bool(cfg.get('parallel_attn_mlp')))}) is not "
                          f"{model}'s ({shape(*want)}), which MIB evaluates the folder on; "
                          + (f"its shape is {fits[0]}'s: give --model {fits[0]}" if fits else
                             "export an edges run of that model (MIB's models: " + ", ".join(MIB_SHAPES) + ")"))


def write_mib(doc: dict, out: str | Path, task: str, model: str) -> Path:
    """MIB's submission layout: OUT/{task}_{model}/importances.json (a task or model MIB does not score refused)."""
    folder = Path(out) / mib_folder(task, model)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "importances.json"
    return write_whole(path, lambda tmp: tmp.write_text(json.dumps(doc)))  # (whole or not at all)


def circuit_file(path: str | Path, where: str) -> Path:
    """The JSON of a circuit given as a file or as MIB's folder (one `*.json` in it or its one subfolder)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob("*.json")) or sorted(p.glob("*/*.json"))
        if len(found) != 1:
            raise ConfigError(f"{where}={str(path)!r}: a MIB folder holds one importances.json (in it or in its "
                              f"one {{task}}_{{model}} folder); found {len(found)} JSON files")
        return found[0]
    if not p.is_file():
        raise ConfigError(f"{where}={str(path)!r}: no such file or folder; give an EAP-IG graph JSON or a MIB folder")
    return p


def read_circuit(path: str | Path, writers: Sequence[str], readers: Sequence[str], mask: np.ndarray,
                 where: str = "patching.faithfulness.from") -> np.ndarray:
    """[writers, readers] scores from an EAP-IG graph JSON or a MIB folder, checked against this graph:
    an edge or node it names that the graph lacks, or an edge of the graph it lacks, is one ConfigError."""
    p = circuit_file(path, where)
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}={str(path)!r}: {p.name} is not JSON ({exc}); give an EAP-IG graph JSON "
                          f"({{cfg, nodes, edges}}) or a MIB folder") from None
    if isinstance(doc, dict) and isinstance(doc.get("edge_scores"), list):
        doc = doc["edge_scores"]
    if isinstance(doc, list):
        return _tl_scores(doc, writers, readers, mask, f"{where}={str(path)!r}")
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), dict) for k in ("cfg", "nodes", "edges")):
        raise ConfigError(f"{where}={str(path)!r}: unknown circuit format (neither EAP-IG's {{cfg, nodes, edges}} nor "
                          f"TransformerLens 4.3's edge_scores records); give EAP-IG's graph JSON, MIB's importances "
                          f"folder or TransformerLens' edge scores")
    names = edge_names(writers, readers)
    index = {names[i][j]: (i, j) for i in range(len(writers)) for j in range(len(readers)) if mask[i, j]}
    known_nodes = {node_name(w) for w in writers} | {"logits"}
    for node in doc["nodes"]:
        if node not in known_nodes:
            raise ConfigError(f"{where}={str(path)!r}: node {node!r} is not in this model's graph "
                              f"({len(known_nodes)} nodes: input, a{{l}}.h{{h}}, m{{l}}, logits); the circuit is for another model")
    scores = np.full((len(writers), len(readers)), np.nan)
    for name, info in doc["edges"].items():
        if name not in index:
            parent, _, child = name.partition("->")
            base, angle, suffix = child.partition("<")
            unknown = next((n for n in (parent, base) if n not in known_nodes), None)
            head, end = base.startswith("a") and ".h" in base, "fix the edge's name"
            if unknown:
                why, end = f"node {unknown!r} is not in it", "the circuit is for another model"
            elif head and (angle + suffix) not in ("<q>", "<k>", "<v>"):
                why = (f"an edge into a head names the input it reads, {base}<q>, {base}<k> or {base}<v>, "
                       f"not {child!r}")
            elif not head and angle:
                why = f"an edge into {base!r} takes no <q>, <k> or <v> suffix (only a head's inputs do), not {child!r}"
            else:
                why, end = (f"both nodes are, but no edge runs from {parent!r} to {child!r} (a writer reaches only the "
                            f"readers of later layers)"), "the circuit is for another model"
            raise ConfigError(f"{where}={str(path)!r}: edge {name!r} is not in this model's graph ({why}); {end}")
        if not isinstance(info, dict):
            raise ConfigError(f"{where}={str(path)!r}: edge {name!r} is {info!r}, not EAP-IG's {{\"score\": ..., "
                              f"\"in_graph\": ...}}; give each edge its score in such an object")
        score = info.get("score")
        if not isinstance(score, int | float) or isinstance(score, bool) or not np.isfinite(score):
            raise ConfigError(f"{where}={str(path)!r}: edge {name!r} has no finite number as its score ({score!r}); "
                              f"faithfulness ranks edges by importance scores")
        scores[index[name]] = float(score)
    missing = np.argwhere(mask & ~np.isfinite(scores))
    if len(missing):
        i, j = missing[0]
        raise ConfigError(f"{where}={str(path)!r}: it scores {int(np.isfinite(scores).sum())} of this model's "
                          f"{int(mask.sum())} edges; edge {names[i][j]!r} is missing (the circuit is for another model)")
    return scores


TL_READERS = {"q_input": "q", "k_input": "k", "v_input": "v"}


def tl_label(node: Any) -> str:
    """hookrun's writer or reader label of a TransformerLens 4.3 Node (as a dict: kind, position, layer, head)."""
    kind, layer, head = node.get("kind"), node.get("layer"), node.get("head")
    if kind == "embed" or kind == "logits":
        return str(kind)
    if kind == "attn_head_out":
        return f"L{layer}.H{head}"
    if kind in ("mlp_out", "mlp_in"):
        return f"L{layer}.MLP"
    if kind in TL_READERS:
        return f"L{layer}.H{head}.{TL_READERS[kind]}"
    raise ValueError(f"unknown TransformerLens node kind {kind!r}")


def _tl_scores(records: list, writers: Sequence[str], readers: Sequence[str], mask: np.ndarray, where: str) -> np.ndarray:
    """TransformerLens 4.3's `AttributionResult.edge_scores` as records {writer, reader, score} (each node
    `dataclasses.asdict(Node)`), summed over positions into the [writers, readers] grid."""
    wi, ri = {w: i for i, w in enumerate(writers)}, {r: j for j, r in enumerate(readers)}
    scores = np.full((len(writers), len(readers)), np.nan)
    for n, rec in enumerate(records):
        try:
            w, r, score = tl_label(rec["writer"]), tl_label(rec["reader"]), float(rec["score"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{where}: record {n} is not a TransformerLens edge score {{writer, reader, score}} ({exc})") from None
        for label, known in ((w, wi), (r, ri)):
            if label not in known:
                raise ConfigError(f"{where}: node {label!r} is not in this model's graph; the circuit is for another model")
        i, j = wi[w], ri[r]
        if not mask[i, j]:
            raise ConfigError(f"{where}: edge {w} -> {r} is not in this model's graph; the circuit is for another model")
        scores[i, j] = score if np.isnan(scores[i, j]) else scores[i, j] + score
    missing = np.argwhere(mask & ~np.isfinite(scores))
    if len(missing):
        i, j = missing[0]
        raise ConfigError(f"{where}: it scores {int(np.isfinite(scores).sum())} of this model's {int(mask.sum())} edges; "
                          f"edge {writers[i]} -> {readers[j]} is missing (the circuit is for another model)")
    return scores


def describe_cfg(meta: dict[str, Any]) -> dict:
    """EAP-IG's cfg of an edges run's graph (its `patching` attribute)."""
    g = meta["graph"]
    return {"n_layers": int(g["n_layers"]), "n_heads": int(g["n_heads"]), "parallel_attn_mlp": bool(g.get("parallel", False)),
            "d_model": int(meta.get("d_model") or 0)}
