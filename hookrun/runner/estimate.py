"""The plan's estimate: one sample through the hooks, to learn each capture's shape and size.

    report = estimate(model, loader, points, env, settings, n_samples)   # settings.batches: the run's batches
    print(report.text())        # what `dry_run=true` prints
    report.total_bytes          # what `output.max_bytes` is checked against

It runs a batch of one (the dataset's first item) with a fresh hook session, so the real run
starts from a clean state; nothing is written. It counts what HDF5 allocates: each dataset's rows
at most (store/__init__.py: `limit`, `every`, the run's samples, samples x tokens for token rows) in
the whole chunks the store will make of them, and HDF5's own metadata; so, uncompressed, the file
a run writes is no larger (variable-length rows aside: the first sample's size stands for all),
and with output.compression the total is an upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hookrun.errors import capture_label, dataset_label, module_label
from hookrun.hooks import HookPoint
from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.session import HookSession
from hookrun.runner.extra_forwards import first_batch
from hookrun.runner.loop import stored_keys, token_width
from hookrun.store import (
    DIGEST_CHUNK,
    INDEX_CHUNK,
    RAGGED_CHUNK,
    TOKEN_CHUNK,
    allocated,
    capped,
    capture_bound,
    chunk_rows,
)
from hookrun.store.columns import chunk_bytes_for
from hookrun.store.overhead import index_bytes, metadata_bytes, table_bytes
from hookrun.store.records import Capture


@dataclass
class Line:
    capture: Capture
    row_bytes: int
    rows: int  # at most
    chunk: int = 1  # rows in a chunk of its dataset, as the store makes it
    index: int = 0  # rows of its `<name>.index` at most, where its rows skip batches (0: none)

    @property
    def total(self) -> int:
        """What HDF5 allocates for it: whole chunks (variable-length rows: their heap objects and
        chunks of 16-byte references), and its index's."""
        if self.capture.ragged:
            data = self.rows * (-(-self.row_bytes // 8) * 8 + 16) + allocated(self.rows, self.chunk) * 16
        else:
            data = allocated(self.rows, self.chunk) * self.row_bytes
        return data + (index_bytes(self.index) if self.index else 0)


@dataclass
class Estimate:
    points: list[HookPoint]
    lines: list[Line] = field(default_factory=list)
    n_samples: int = 0
    n_batches: int = 0
    header: list[str] = field(default_factory=list)
    extra_bytes: int = 0  # /samples (index, step, target, data.store keys, token map), /checksums, the kind's own
    meta_bytes: int = 0  # HDF5's own: object headers, chunk B-trees, groups (store/__init__.py)
    state_bytes: int = 0  # stateful actions' state (top_examples: features x k), in its two slots under /state
    state_groups: int = 0  # ... and its groups
    unestimated: str = ""  # what the estimate leaves out: a kind's rows that are not batches (RunKind.estimated)
    kind_lines: list[str] = field(default_factory=list)  # the kind's own (RunKind.plan_lines)
    kind: str = ""  # the run's kind (its captures of no hook point are listed under its name)

    @property
    def total_bytes(self) -> int:
        return sum(line.total for line in self.lines) + self.extra_bytes + self.state_bytes + self.meta_bytes

    def check_max_bytes(self, limit: int) -> None:
        """`output.max_bytes`: refuse a run whose estimated file exceeds it, or whose rows are not estimated."""
        from hookrun.errors import ConfigError

        if self.unestimated:
            raise ConfigError(f"output.max_bytes: the estimate leaves out {self.unestimated}, so it would not bound "
                              f"the file; drop output.max_bytes (dry_run=true shows what it counts)")
        if self.total_bytes > limit:
            from hookrun.analysis.stats import human_bytes

            total = self.total_bytes
            raise ConfigError(
                f"output.max_bytes: the estimated file size {human_bytes(total)} ({total} bytes) exceeds "
                f"output.max_bytes={limit}; record less (what, select, reduce, dtype, every, limit, data.limit) "
                f"or raise output.max_bytes (dry_run=true shows the estimate per capture)"
            )

    def text(self) -> str:
        # (dry_run's printout only: analysis/ is not on a run's route)
        from hookrun.analysis.stats import human_bytes

        out = list(self.header)
        by_hook: dict[str, list[HookPoint]] = {}
        for p in self.points:
            by_hook.setdefault(p.hook, []).append(p)
        for hook, points in by_hook.items():
            names = ", ".join(module_label(p.module) for p in points)
            out.append(f"  hook {hook}: {points[0].type} -> {len(points)} {'target' if len(points) == 1 else 'targets'}: {names}")
            out += [_line_text(ln) for ln in self.lines if ln.capture.key.hook == hook] or ["    (records nothing)"]
        own = [_line_text(ln, named=True) for ln in self.lines if ln.capture.key.hook not in by_hook]  # (a kind's step adds them)
        out += [f"  the {self.kind or 'run'} kind's own captures:", *own] if own else []
        out += self.kind_lines
        state = f"{human_bytes(self.state_bytes)} of actions' state (/state), " if self.state_bytes else ""
        out.append(f"  besides the captures: {human_bytes(self.extra_bytes)} (/samples, /checksums), {state}"
                   f"{human_bytes(self.meta_bytes)} of HDF5 metadata")
        out.append(f"  estimated file size: {human_bytes(self.total_bytes)} for {self.n_samples} samples in {self.n_batches} "
                   f"batches ({self.total_bytes} bytes uncompressed, in whole HDF5 chunks; with output.compression an upper bound)"
                   + (f"; not counted: {self.unestimated}" if self.unestimated else ""))
        return "\n".join(out)


def _line_text(line: Line, named: bool = False) -> str:
    """One capture's row of the printout: its label (`named`: after its hook's name, as inspect says it), dtype,
    shape, bytes per row and in all."""
    from hookrun.analysis.stats import human_bytes

    c = line.capture
    shape = ("n",) if c.ragged else tuple(c.value.shape) if c.per_step else tuple(c.value.shape[1:])
    unit = "step" if c.per_step else "token" if c.tokens else "feature" if c.features else "sample"
    label = (f"{c.key.hook}/" if named else "") + capture_label(c.key.module, c.key.role, c.key.call)
    dtype = c.value[0].dtype if c.ragged else c.value.dtype
    return (f"    {label:34s} {str(dtype).replace('torch.', ''):8s} {str(shape):20s} "
            f"{human_bytes(line.row_bytes):>10s}/{unit} x {line.rows} = {human_bytes(line.total)}")


def estimate(model: torch.nn.Module, loader, points: list[HookPoint], env: ActionEnv, settings, n_samples: int,
             checksum: bool = False, attrs_bytes: int = 0) -> Estimate:
    """`attrs_bytes`: the file's root attributes (the config's YAML)."""
    n_batches = len(settings.batches)
    kind = settings.kind
    indices, call = first_batch(loader, settings.spec)
    call = call.to(settings.device)
    with HookSession(points, env) as session:
        session.begin_step(0, 1, indices, call.attention_mask, call.batch)  # (a lens reads its target there)
        kind.sample_step(model, call, session)
        captures = env.captures.take()
        ends = [(a.finish(), a.state() or {}) for a in env.stateful]  # their size is fixed at the first batch (features x k)
    width = token_width(kind, call)  # token rows per sample at most: the padded width (generate: and new tokens)
    for p in points:
        for action in p.actions:
            action.reset()
    report = Estimate(points, n_samples=n_samples, n_batches=n_batches, kind=kind.name,
                      unestimated="" if kind.estimated else f"the {kind.name} run's {kind.units[1]}")
    batch = max(1, min(loader.batch_size or 1, n_samples))
    datasets: list[tuple[int, int, bool]] = []  # (rank, chunks, a capture's) of each dataset: its metadata
    digested = 0  # /checksums rows: one per batch that appends to a digested dataset (store/writer.py)
    for cap in captures:
        line = capture_line(cap, n_samples, n_batches, batch, width, chunk_bytes_for(len(captures)))
        report.lines.append(line)
        rank = 1 if cap.ragged else cap.value.dim() + cap.per_step
        datasets.append((rank, math.ceil(line.rows / line.chunk), True))
        digested += min(n_batches, line.rows) * (2 if line.index else 1)  # (a row at least in each batch it takes)
        if line.index:
            datasets.append((1, math.ceil(line.index / capped(INDEX_CHUNK, line.index)), False))
    groups_of = list(captures)
    for finished, state in ends:  # end-of-run captures (written whole) and the state saved at each flush
        for cap in finished:
            value = cap.value
            line = Line(cap, value[0].numel() * value.element_size() if value.dim() else 0, value.shape[0] if value.dim() else 1,
                        max(1, value.shape[0] if value.dim() else 1))
            report.lines.append(line)
            datasets.append((max(1, value.dim()), 1, True))
            digested += 1
        groups_of += finished
        arrays = [np.asarray(v.numpy(force=True) if isinstance(v, torch.Tensor) else v) for v in state.values()]
        slots = min(2, n_batches)  # two slots written in turn, in place (store/run_state.py)
        report.state_bytes += slots * sum(a.nbytes for a in arrays)
        datasets += [(max(1, a.ndim), 1, False) for a in arrays] * slots
        report.state_groups += (2 + slots) if arrays else 0  # /state/KEY and its slots (/state: once, below)
    report.state_groups += 1 if report.state_bytes else 0  # /state
    before = len(datasets)
    report.extra_bytes = kind.file_bytes(n_samples) + sample_bytes(loader, call, settings, n_samples, datasets)
    report.kind_lines = kind.plan_lines(n_samples)
    digested += n_batches * (len(datasets) - before)  # (every /samples dataset, each batch)
    tokens = [len(c.value) for c in captures if c.tokens]
    if tokens:  # the token map: /samples/token_sample, token_position (and token_generated: generate)
        rows, n = n_samples * (width or max(tokens)), 3 if kind.token_rows(call) else 2
        report.extra_bytes += allocated(rows, capped(TOKEN_CHUNK, rows)) * (17 if n == 3 else 16)
        datasets += [(1, math.ceil(rows / capped(TOKEN_CHUNK, rows)), False)] * n
        digested += n_batches * n
    if checksum:  # output.checksum: a row of 3 uint64 in /checksums per batch and dataset it appends to (captures,
        rows = digested  # their .index, every /samples dataset, the token map; not /state, written in place)
        report.extra_bytes += allocated(rows, capped(DIGEST_CHUNK, rows)) * 24
        datasets.append((2, math.ceil(rows / capped(DIGEST_CHUNK, rows)), False))
    groups = {"", "samples"} | {c.key.path.rsplit("/", k)[0] for c in groups_of for k in range(1, c.key.path.count("/") + 1)}
    report.meta_bytes = metadata_bytes(datasets, len(groups) + report.state_groups, attrs_bytes)
    return report


END_ATTRS = 12  # the root attributes a run adds as it goes (status, ...)


def plan_estimate(p: Any, attrs: dict) -> Estimate:
    """The plan's estimated bytes per capture (dry_run=true prints it; output.max_bytes checks it) for
    prepare()'s Prepared `p`, whose file gets the root attributes `attrs` (run.py's open_store's)."""
    text = table_bytes(0, 0, len(attrs) + END_ATTRS, sum(len(str(v).encode()) for v in attrs.values()))
    report, cfg = estimate(p.model, p.loader, p.points, p.env, p.settings, p.n_samples, p.cfg.output.checksum, text), p.cfg
    report.header = [
        "hookrun plan" + (" (dry run: nothing is written)" if cfg.dry_run else ""),
        f"  model   {type(p.model).__module__}.{type(p.model).__qualname__} on {p.settings.device}, mode {p.settings.mode}",
        f"  data    {dataset_label(cfg.data.dataset)}: {len(p.dataset)} samples; this run: {p.n_samples} samples in {p.n_batches} batches of {cfg.data.batch_size}",
        f"  output  {p.out} (compression {cfg.output.compression.value})",
    ]
    return report


def capture_line(cap: Capture, n_samples: int, n_batches: int, batch: int, width: int | None, chunk_bytes: int) -> Line:
    """A capture's rows at most and its chunks, as the store will make them (store/columns.py)."""
    if cap.ragged:  # variable-length rows: the first sample's size stands for all
        row_bytes = sum(v.numel() * v.element_size() for v in cap.value)
        return Line(cap, row_bytes, n_batches if cap.per_step else n_samples, RAGGED_CHUNK)
    value = cap.value if cap.per_step else cap.value[0]
    row_bytes = value.numel() * cap.value.element_size()
    rows = capture_bound(cap, n_samples, n_batches, batch, width or len(cap.value)) or 0
    full = n_batches if cap.per_step else n_samples
    every = int(cap.attrs.get("every", 1))
    skips = not cap.tokens and rows < full and (every == 1 or math.ceil(n_batches / every) > 1)
    return Line(cap, row_bytes, rows, chunk_rows(row_bytes, chunk_bytes, rows), rows if skips else 0)


def sample_bytes(loader, call, settings, n: int, datasets: list) -> int:
    """/samples/index, step, target and the data.store keys (a lens's attention_mask) of `n` samples, in their chunks."""
    chunk = capped(INDEX_CHUNK, n)
    target = call.target if isinstance(call.target, torch.Tensor) and call.target.dim() else None
    rows = [(8, 1), (8, 1)] + ([(target[0].numel() * target.element_size(), target.dim())] if target is not None else [])
    total = sum(allocated(n, chunk) * b for b, _ in rows)
    datasets += [(rank, math.ceil(n / chunk), False) for _, rank in rows]
    try:
        stored = stored_keys(loader.collate_fn([loader.dataset[0]])[1], settings.store_keys) or {}
    except Exception:  # (the run says what is wrong with data.store)
        stored = {}
    mask = call.attention_mask  # a lens's run stores it, data.store naming it or not (runner/loop.py)
    if settings.store_mask and isinstance(mask, torch.Tensor) and mask.dim() == 2 and "attention_mask" not in stored:
        stored["attention_mask"] = mask.detach().cpu().numpy()
    for arr in stored.values():
        total += allocated(n, min(4096, chunk)) * arr[0].nbytes
        datasets.append((arr.ndim, math.ceil(n / min(4096, chunk)), False))
    return total
