"""The patching kind: a run whose steps are chunks of a patching grid's cells (docs/patching.md).

    python -m hookrun experiment=patching_grid        # the `patching:` block turns this kind on

A step is one chunk of cells (one packed forward; with method=atp one step holds every cell); its
rows are cells, numbered as in runner/kinds/patching/cells.py, so /samples/index holds cell numbers and
the capture `patching/cells/value` (and `patching/cells/exact`: atp's exactly recomputed cells,
NaN elsewhere) one value per cell. The file's root attribute `patching` (JSON) holds the layout
(each site's modules, over axes and sizes, first cell), the metric's name, method, direction,
metric_clean, metric_corrupt, normalize and the token text of the positions: the reader
(hookrun.analysis.run_reader: `run.grids`, `run.grid(name)`) reshapes the rows into labelled grids.
Rows are appended through the store's normal path: flushes, crash safety and resume (which goes on
from the first cell not written) come from it. Over many ranks (torchrun, submitit, srun) the
ranks split the cells, not the data: rank r of N computes cells r, r+N, r+2N, ... (strided, so
that each rank gets as many cells of each block, and the cheap upper blocks are not all one
rank's) into its own shard; the merged view's rows are every rank's cells and the reader places
them by cell number. A resumed shard goes on with its own cells not yet written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError
from hookrun.output.process import every_rank
from hookrun.runner.kinds import RunKind
from hookrun.runner.kinds.patching.block import load_items
from hookrun.runner.kinds.patching.checks import refuse_modifying, refuse_recording
from hookrun.runner.kinds.patching.edges.mib import summary as mib_summary
from hookrun.runner.kinds.patching.edges.run import check_atp_ig, edge_layout, streams
from hookrun.runner.kinds.patching.edges.run import compute as compute_edges
from hookrun.runner.kinds.patching.edges.run import prepare as prepare_edges
from hookrun.runner.kinds.patching.edges.spec import EDGE_METHODS, check_not_own_output
from hookrun.runner.kinds.patching.engine import PatchEngine
from hookrun.runner.kinds.patching.forward_inputs import check_inputs
from hookrun.runner.kinds.patching.notebook import forward_arguments, grid_attrs, run_cells
from hookrun.runner.kinds.patching.reader import CELL_UNITS, faithfulness_lines
from hookrun.store.records import Capture, CaptureKey, StepRecord
from hookrun.text_labels import token_label

KEY = {which: CaptureKey("patching", "cells", "patching", which) for which in ("value", "exact")}


class PatchingKind(RunKind):
    block = "patching"
    forwards = 0  # per data batch: the cells decide (one packed forward per chunk; atp: 2 + a backward)
    adds = ("captures/patching",)  # the cells' rows (the warning "no hook records anything" asks)
    units = CELL_UNITS  # a step is one chunk of cells; a row is a cell
    estimated = False  # the cells' rows are not in the dry-run estimate
    engine: PatchRun | None = None
    rank, world = 0, 1  # this process's share of the cells: every world-th from rank (share())

    def share(self, rank: int, world: int) -> str:
        """Many ranks: every `world`-th cell from cell `rank` is this rank's (the data is not split:
        every cell's value is the metric over every item)."""
        self.rank, self.world = rank, world
        return f"cells {rank}, {rank + world}, {rank + 2 * world}, ..."

    def prepare_run(self, p: Any) -> None:
        self.engine = PatchRun(p, self.rank, self.world)

    def end_note(self) -> str:
        """An edges run's recovered fractions (per k, and MIB's CPR / CMD), for the run's last log line."""
        edges = self.engine.edges if self.engine is not None else None
        curve = edges.faithfulness if edges is not None else None
        lines = faithfulness_lines({**curve, "mib": None}) if curve else []
        mib = (curve or {}).get("mib")
        return "; ".join([line.strip() for line in lines] + ([f"MIB {mib_summary(mib)}"] if mib else []))

    def end_attrs(self) -> dict[str, Any]:
        """An edges grid written as it goes: its `patching` attribute with the node scores and faithfulness."""
        return self.engine.final if self.engine is not None else {}

    def run_steps(self, data_loop: Any, writer: Any, first_row: int, should_stop: Any) -> int:
        """Chunks of cells, not batches of the data: rows are this rank's cells, from the first not written."""
        return self.engine.run(writer, first_row, should_stop)

    def restore(self, resume: Any, kept: int) -> None:
        self.engine.kept = kept  # the steps this rank's shard holds

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    @classmethod
    def call_inputs(cls, cfg: HookrunConfig) -> tuple[Any, Any]:
        """`patching.input` alone sends the clean (and, in the cells, the corrupted) input to the forward:
        without data.inputs, the site check's forward of the first item is {input: item[clean]}, no target;
        a data.inputs mapping adds its inputs (an attention_mask) to that one."""
        block = cfg.patching
        get = (lambda k, d: block.get(k, d)) if isinstance(block, dict) else (lambda k, d: getattr(block, k, d))
        ids = {str(get("input", "input_ids")): str(get("clean", "clean"))}
        if isinstance(cfg.data.inputs, Mapping):  # more inputs (an attention_mask) beside the ids
            return {**ids, **cfg.data.inputs}, cfg.data.target
        if cfg.data.inputs is not None:
            return cfg.data.inputs, cfg.data.target
        return ids, None if cfg.data.target == "auto" else cfg.data.target

    @classmethod
    def check_mode(cls, cfg: HookrunConfig) -> None:
        if cfg.mode is not Mode.eval:
            raise ConfigError(f"patching with mode={cfg.mode.value}: a patching run makes its own forwards (clean, "
                              "corrupted, patched; atp its own backward); drop mode or set mode=eval")

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        cls.check_mode(cfg)
        check_inputs(cfg.patching.checked(), cfg.data.inputs)  # (parsed and checked once, by load)
        check_not_own_output(cfg.patching.checked().faithfulness, cfg.output.path)

    def check_actions(self) -> None:
        super().check_actions()
        refuse_recording(self.ctx.points)
        refuse_modifying(self.ctx.points, self.ctx.cfg.patching.checked().method)

    @classmethod
    def inputs_refused(cls, cfg: HookrunConfig, model: Any, refusal: Exception) -> Exception:
        """The model's inputs and what patching needs, where the items cannot be built or their
        input is not an argument of the forward (an edges experiment with data=shapes, or on a
        vision model), instead of a data.inputs mapping that leads nowhere."""
        block = cfg.patching
        key, clean, corrupt = (getattr(block, k) for k in ("input", "clean", "corrupt"))
        takes, open_kwargs = forward_arguments(model)
        named = f"{type(model).__name__}.forward takes {', '.join(takes[:4]) or 'no named argument'}{', ...' if len(takes) > 4 else ''}"
        edges = str(getattr(block, "method", "")) in EDGE_METHODS  # a transformer's residual graph: tokens only
        needs = (f"a patching run sends each item's {clean!r} and {corrupt!r} (the same shape) to the forward's "
                 f"{key!r} (patching.input): token ids for a language model (experiment=edges and experiment=patching_grid "
                 f"build them with their own data=custom and model=tiny_lm)"
                 + ("" if edges else ", or an image for an image model with patching.input set to its argument")
                 + " (docs/patching.md)")
        if takes and key not in takes and not open_kwargs:
            return ConfigError(f"patching.input={key!r}: {named}, not {key}; {needs}")
        return ConfigError(f"{refusal} ({named}); {needs}; a data=... given with such an experiment replaces its items: drop it")


class PatchRun:
    """The engine of a file run, set up (base runs, every check) before the file is opened."""

    def __init__(self, p: Any, rank: int = 0, world: int = 1) -> None:
        cfg = p.cfg
        PatchingKind.check(cfg)
        self.block = cfg.patching.checked()
        limit = None if cfg.data.limit is None else cfg.data.limit * cfg.data.batch_size
        items = load_items(p.dataset, self.block, limit, p.settings.device)
        edges = prepare_edges(p.model, self.block, items) if self.block.method in EDGE_METHODS else None
        check_atp_ig(p.model, self.block)
        self.engine = PatchEngine(p.model, self.block, items, p.env, p.points, cfg.data.inputs).__enter__()
        p.points = []  # the engine's session holds them (a splice must not run twice)
        e = self.engine
        meta = {**grid_attrs(e, self.block), "layout": e.layout.describe(), "cells": e.layout.size,
                "cells_per_forward": e.cells_per_forward, "labels": token_labels(p.dataset, items[self.block.clean])}
        self.edges, self.pending, self.final = None, None, {}
        if edges is not None:  # the [writer, reader] grid is the one grid `edges`, written as cells
            try:
                if streams(e, *edges):  # bounded by patching.memory: computed in run(), each reader group written as it is done
                    self.pending = edges
                    meta.update(graph=edges[0].describe(), layout=edge_layout(edges[0]), cells=edges[0].mask.size,
                                grid_complete=False)
                else:  # computed here, before the file opens
                    self.edges = compute_edges(e, *edges)
                    meta.update(self.edges.meta(), layout=self.edges.layout(), cells=self.edges.scores.size)
            except BaseException:
                self.close()
                raise
        self.meta = meta
        size = meta["cells"]
        p.attrs["patching"] = json.dumps(meta)
        if world > size:
            self.close()  # (the model comes back unhooked)
            raise every_rank(ConfigError(
                f"patching: the run has {world} processes but its grids only {e.layout.size} cell(s); each process "
                f"needs at least one: run at most {e.layout.size} processes, or patch more cells"))
        self.cells = range(rank, size, world)
        self.kept = 0  # a resumed run's steps already in the file (PatchingKind.restore)
        self.rank, self.world = rank, world  # a step's number: its chunk's, interleaved as the cells are

    def close(self) -> None:
        self.engine.__exit__(None, None, None)

    def run(self, writer: Any, first_row: int, should_stop: Any) -> int:
        """Write this rank's cells from its `first_row`-th on (those written before are kept), a chunk
        a step; the number of steps written."""
        cells = self.cells[first_row:]
        if not cells:
            return 0
        steps = [0]
        step0 = (self.kept if self.edges is not None or self.pending is not None  # an edges grid's steps are not chunks
                 else sum(1 for _ in self.engine.chunks(self.cells[:first_row])))  # the chunks written (whole ones)

        def put(ks: list[int], values: np.ndarray, exact: np.ndarray) -> None:
            rows = len(ks)
            writer.put(StepRecord(
                step=(step0 + steps[0]) * self.world + self.rank, sample_index=np.asarray(ks, dtype=np.int64), target=None, path=None,
                captures=[Capture(KEY[role], torch.as_tensor(np.asarray(v, dtype=np.float64)).reshape(rows), False, dims=("cell",))
                          for role, v in (("value", values), ("exact", exact))]))  # rows are cells, /samples/index their numbers
            steps[0] += 1
            if should_stop():
                raise _Stop

        try:
            if self.pending is not None:
                self.stream(put, first_row)
            elif self.edges is not None:  # every rank holds the whole grid; it writes its own cells of it
                put(list(cells), self.edges.scores.reshape(-1)[list(cells)], np.full(len(cells), np.nan))
            else:
                run_cells(self.engine, cells, on_chunk=put)
        except _Stop:
            pass
        return steps[0]


    def stream(self, put: Any, first_row: int) -> None:
        """The bounded edges run (edges/bounded.py): each reader group's columns, this rank's cells of them, put
        as one step the moment the backward has finished them; the rows a resumed run already holds (the same
        deterministic order) are skipped. The `patching` attribute gets the node scores once every group is in."""
        graph = self.pending[0]
        n_readers = len(graph.readers)
        skip = [first_row]

        def sink(rs: slice, columns: np.ndarray) -> None:
            ks = np.add.outer(np.arange(len(graph.writers)) * n_readers, np.arange(rs.start, rs.stop)).reshape(-1)
            mine = ks % self.world == self.rank
            ks, values = ks[mine], columns.reshape(-1)[mine]
            drop = min(skip[0], len(ks))
            skip[0] -= drop
            if drop < len(ks):
                put(ks[drop:].tolist(), values[drop:], np.full(len(ks) - drop, np.nan))

        self.edges = compute_edges(self.engine, *self.pending, sink=sink)
        self.final = {"patching": json.dumps({**self.meta, **self.edges.meta(), "grid_complete": True})}


class _Stop(Exception):
    """A signal asked the run to stop after the chunk in flight."""


def token_labels(dataset: Any, ids: torch.Tensor) -> list[str] | None:
    """Each position's label, where the data set has a tokenizer: `p:TEXT` where every item has the
    same token there (a cell is the mean over the items), its text made visible (labels.token_label:
    '0:<bos>', '6:␣'), else its number in brackets ("[5]": the first item's text was shown for all).
    Each label names its position, so none is blank and no two are alike."""
    tok = getattr(dataset, "tokenizer", None)
    if tok is None or not hasattr(tok, "decode"):
        return None
    try:
        same = (ids == ids[:1]).all(dim=0).tolist()
        return [f"{p}:{token_label(tok.decode([t]), _special(tok, t))}" if same[p] else f"[{p}]"
                for p, t in enumerate(ids[0].tolist())]
    except Exception:  # a tokenizer that cannot decode one id: integer positions
        return None


def _special(tok: Any, t: int) -> str:
    """A token that decodes to nothing (a special one, skipped by decode): <bos>, <eos>, <pad>, <unk> by
    the tokenizer's ids, else its id in angle brackets."""
    return next((f"<{n}>" for n in ("bos", "eos", "pad", "unk") if getattr(tok, f"{n}_token_id", None) == t), f"<{t}>")
