"""`python -m hookrun.circuits`: an edges run's scores to other tools' files, and their circuits scored here.

    python -m hookrun.circuits export outputs/edges/captures.h5 --format eap-ig graph.json
    python -m hookrun.circuits export outputs/edges/captures.h5 --format mib submission --task ioi --model gpt2
    python -m hookrun.circuits score outputs/edges/captures.h5 --circuit graph.json --out scored.h5
    python -m hookrun.circuits score my_config.yaml --circuit submission/ioi_gpt2 --fractions 0.01,0.1,1

`export` writes EAP-IG's graph JSON (hannamw/EAP-IG's `Graph.from_json` loads it) or MIB's submission
folder (`OUT/{task}_{model}/importances.json`); `--fraction F` marks MIB's circuit of that fraction of
the edges (top by |score|, pruned) as `in_graph`, every edge otherwise. `score` runs the run's (or the
YAML config's) model and items again with `patching.faithfulness.from: CIRCUIT` and MIB's fractions
(docs/edges.md): the circuit's scores rank the edges; the CPR / CMD line is printed and the scoring run
written to --out (without it, to a temporary folder removed at the end). A file of unknown format, or a
circuit for another model, is one line naming what is wrong; so is a run exported as one of MIB's models whose
shape (layers, heads, d_model) it does not have.

The patching kind's command: hookrun/circuits.py, the entry point, makes the parser and ends it as
every command ends (hookrun/cli/__init__.py).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hookrun.analysis.opening import open_run
from hookrun.config.schema import plugin_names
from hookrun.errors import ConfigError
from hookrun.runner.kinds.patching.edges.formats import (
    FORMATS,
    check_mib_shape,
    describe_cfg,
    mib_folder,
    to_eap_ig,
    write_mib,
)
from hookrun.runner.kinds.patching.edges.graph import Graph, unscored
from hookrun.runner.kinds.patching.edges.mib import mib_circuit, mib_sign
from hookrun.runner.kinds.patching.edges.spec import parse_fractions
from hookrun.store.paths import local_only, local_path
from hookrun.store.whole_file import write_whole


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's subcommands and options (hookrun/circuits.py, the entry point, makes the parser)."""
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="an edges run's scores as EAP-IG's graph JSON or MIB's submission folder")
    e.add_argument("run", help="an edges run's file (patching method eap / eap_ig)")
    e.add_argument("--format", required=True, help=f"one of: {', '.join(FORMATS)}")
    e.add_argument("out", help="eap-ig: the JSON file; mib: the submission folder")
    e.add_argument("--task", help="mib: one of MIB's tasks (ioi, mcqa, arithmetic-addition, arc-easy, ...)")
    e.add_argument("--model", help="mib: one of MIB's models (gpt2, qwen2.5, gemma2, llama3, interpbench)")
    e.add_argument("--fraction", type=float, help="mark MIB's circuit of this fraction of the edges as in_graph")
    s = sub.add_parser("score", help="faithfulness (MIB's CPR and CMD) of a circuit file on a run's model and items")
    s.add_argument("source", help="an edges run's file (its stored config is run again) or a YAML config")
    s.add_argument("--circuit", required=True, help="an EAP-IG graph JSON, a MIB folder or an edges run's file")
    s.add_argument("--fractions", default="mib", help="mib, or fractions in (0, 1] separated by commas")
    s.add_argument("--out", help="the run file to keep (default: none kept); never the source run")
    s.add_argument("--overwrite", action="store_true", help="replace the file --out names if it exists")


def run(a: argparse.Namespace) -> int:
    """The subcommand the arguments name; its exit code (a HookrunError is the entry point's one line)."""
    return export(a) if a.command == "export" else score(a)


def export(a: argparse.Namespace) -> int:
    """Write the run's [writer, reader] scores in `a.format`; print the path."""
    if a.format not in FORMATS:
        raise ConfigError(f"--format {a.format!r}; choose from: {', '.join(FORMATS)}")
    if a.format == "mib" and not (a.task and a.model):
        raise ConfigError("--format mib needs --task and --model: MIB reads the folder {task}_{model} (e.g. --task ioi --model gpt2)")
    if a.format == "mib":
        mib_folder(a.task, a.model)  # (a name MIB's run_evaluation.py skips, refused before anything is read or written)
    if a.fraction is not None and not 0 < a.fraction <= 1:
        raise ConfigError(f"--fraction {a.fraction}; give a fraction of the edges in (0, 1]")
    a.out = local_only(a.out, "out", "circuits export")
    _check_export_out(a)
    with open_run(a.run) as run:
        meta = json.loads(run.attrs.get("patching") or "{}")
        if "graph" not in meta:
            raise ConfigError(f"{a.run}: holds no edge grid (an edges run: patching method eap or eap_ig)")
        try:
            scores = np.asarray(run.edges(top=0)[1].values, dtype=np.float64) * mib_sign(meta.get("direction"))
        except LookupError as exc:  # (a run stopped part-way: resume it first)
            raise ConfigError(str(exc).strip("'\"")) from None
    g = meta["graph"]
    cfg = describe_cfg(meta)
    if a.format == "mib":  # (a graph of another shape was written under the model's name without a word)
        check_mib_shape(cfg, a.model)
    mask = Graph(int(g["n_layers"]), int(g["n_heads"]), bool(g.get("parallel"))).mask
    lost = unscored(mask, scores, g["writers"], g["readers"])
    if lost:  # (they were left out of the JSON without a word)
        raise ConfigError(f"{a.run}: {lost}; EAP-IG's and MIB's files score every edge of the graph")
    kept, edges = None, int(np.isfinite(scores).sum())
    if a.fraction is not None and int(a.fraction * edges) == 0:  # (a circuit of no edge was written, said as any other)
        raise ConfigError(f"--fraction {a.fraction} keeps no edge of the run's {edges} (MIB's count: int(fraction x edges)); "
                          f"give at least {math.ceil(1e4 / edges) / 1e4:g}, one edge")
    if a.fraction is not None:
        kept = mib_circuit(_Graph(g["writers"], g["readers"], np.isfinite(scores)), scores,
                           int(a.fraction * edges), absolute=True)
    doc = to_eap_ig(g["writers"], g["readers"], scores, cfg, kept)
    try:
        if a.format == "mib":
            path = write_mib(doc, a.out, a.task, a.model)
        else:
            path = Path(a.out)
            if path.is_dir():
                raise ConfigError(f"{a.out}: a folder; --format eap-ig writes one JSON file: name it, e.g. {path / 'graph.json'}")
            path.parent.mkdir(parents=True, exist_ok=True)
            write_whole(path, lambda tmp: tmp.write_text(json.dumps(doc)))  # (a full disk leaves no cut-off JSON)
    except OSError as exc:
        raise ConfigError(f"{a.out}: cannot write ({exc.strerror or exc}); name a writable path") from None
    print(f"wrote {path} ({len(doc['edges'])} edges, {len(doc['nodes'])} nodes)")
    return 0


def score(a: argparse.Namespace) -> int:
    """Run the source's config again with faithfulness.from: the circuit; print the run's faithfulness line."""
    from hookrun.runner import run

    try:
        fractions = parse_fractions("mib" if a.fractions == "mib" else _numbers(a.fractions))
    except ConfigError as exc:  # (named as the command line gave it, not as the config key it becomes)
        raise ConfigError(f"--fractions {a.fractions}: {str(exc).partition('; ')[2] or exc}") from None
    _check_out(a)
    cfg = _config(a.source)
    if not cfg.get("patching"):
        kind = next((k for k in plugin_names() if cfg.get(k)), None)
        raise ConfigError(f"{a.source}: its config{f' (a run of kind {kind})' if kind else ''} has no patching block to score the "
                          f"circuit on; give an edges run's file (patching method eap or eap_ig) or a YAML config with one")
    patching = dict(cfg.get("patching") or {})
    faith = dict(patching.get("faithfulness") or {})
    for key in ("sites", "verify"):  # a node-site run's keys: the edges run patches no site
        patching.pop(key, None)
    patching.update(method="eap", ig_steps=1, faithfulness={"fractions": list(fractions), "from": str(a.circuit),
                                                            "ablation": faith.get("ablation", "corrupt")})
    with tempfile.TemporaryDirectory(prefix="hookrun_circuit_") as temp:  # (removed on return and on error)
        out = local_path(a.out) if a.out else str(Path(temp) / "scored.h5")
        cfg.update(patching=patching, progress=False, output={**dict(cfg.get("output") or {}), "path": out,
                                                              "overwrite": True, "staging": None})
        result = run(cfg)
    print(f"{a.circuit}: {result.note}")
    if a.out:
        print(f"file: {result.path}")
    return 0


def _check_export_out(a: argparse.Namespace) -> None:
    """--format eap-ig's OUT: never the run being exported, nor another HDF5 file (a run), which the JSON would
    replace; before anything is read or written."""
    import h5py

    out = Path(a.out).expanduser()
    if a.format != "eap-ig" or not out.is_file():
        return
    if out.resolve() == Path(a.run).expanduser().resolve():
        raise ConfigError(f"{a.out} is the run being exported: the JSON would replace it; name another file, e.g. graph.json")
    if h5py.is_hdf5(out):
        raise ConfigError(f"{a.out} is an HDF5 file (a run's?), which the JSON would replace; name a .json file, e.g. graph.json")


def _check_out(a: argparse.Namespace) -> None:
    """--out: never the run being scored (the rescoring run would replace it), nor an existing file unless
    --overwrite says so; before anything is read or written."""
    if a.out is None:
        return
    local_only(a.out, "--out", "circuits score")
    out, source = Path(local_path(a.out)).expanduser(), Path(a.source).expanduser()
    if out.resolve() == source.resolve():
        raise ConfigError(f"--out {a.out} is the run being scored: the rescoring run would replace it; name another --out")
    if out.exists() and not a.overwrite:
        raise ConfigError(f"--out {a.out} exists; name another --out, or add --overwrite to replace it")


def _numbers(text: str) -> list[Any]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        return [text]


def _config(source: str) -> dict:
    """A run's stored config (its `config` root attribute), or a YAML config file, as a dict."""
    import yaml

    p = Path(source)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise ConfigError(f"{source}: no such config file")
        try:
            cfg = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            raise ConfigError(f"{source}: not valid YAML" + (f" (line {where.line + 1}: {exc.problem})" if where else "")
                              + "; give a hookrun config (model:, data:, patching: ...)") from None
        if cfg is not None and not isinstance(cfg, dict):
            raise ConfigError(f"{source}: holds a {type(cfg).__name__}, not a config mapping (model:, data:, patching: ...)")
        if isinstance(cfg, dict) and "defaults" in cfg:  # (Hydra composes such a file; run.run reads whole configs)
            raise ConfigError(f"{source}: a Hydra file with defaults:, which circuits score does not compose; run it "
                              f"(python -m hookrun experiment={p.stem} for conf/experiment/{p.name}) and score that run's "
                              f"captures.h5, or give a whole config (model:, data:, patching: ...)")
        return dict(cfg or {})
    with open_run(source) as run:
        cfg = run.config
    if not cfg:
        raise ConfigError(f"{source}: the run keeps no config to run again; give a YAML config")
    live = [f"{where} {node['live']}" for where, node in (("model", cfg.get("model")),
                                                          ("data.dataset", (cfg.get("data") or {}).get("dataset")))
            if isinstance(node, dict) and "live" in node]
    if live:
        raise ConfigError(f"{source}: the run was given Python objects ({', '.join(live)}), which its file cannot build "
                          f"again; give a YAML config that builds them, or score in Python with hookrun.patch_grid(model, "
                          f"items, faithfulness={{'from': CIRCUIT, 'fractions': 'mib'}})")
    return dict(cfg)


class _Graph:
    """The graph as mib_circuit reads it: labels and the edge mask."""

    def __init__(self, writers: list[str], readers: list[str], mask: np.ndarray) -> None:
        self.writers, self.readers, self.mask = writers, readers, mask
