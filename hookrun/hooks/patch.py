"""The `patch` op: put activations recorded by an earlier run in place of this run's.

    actions: [{name: modify_output, op: patch, source: outputs/clean/captures.h5}]
    actions: [{name: modify_output, op: patch, source: "s3://bucket/clean/captures.h5"}]

The source is any run `open_run` reads (store/reading.py): a file, a run folder, a merged view of
ranks, or an object-store cache (its parts fetched and verified when the plan is built).

The capture is found by module (default: the hooked module), role (default: the role being
replaced) and, where several hooks recorded it, `hook`. Rows are matched by dataset sample
index, so the batch sizes of the two runs may differ. Tokens are matched by position among the
sample's real tokens where the source stored its attention mask (/samples/attention_mask) and this
batch has one: a right-padded source patches a left-padded run (mode=generate pads on the left)
token for token, this run's padding keeps its own values. Every check (file, capture, samples)
runs when the plan is built, before any batch; in mode=generate the op patches the prompt pass
(`positions: prompt`): the passes over new tokens have no recorded rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import h5py
import numpy as np
import torch

from hookrun.errors import ConfigError, HookrunError, NotFoundError, RunError, module_label
from hookrun.hooks.ops import OpBuild, OpContext, register_op
from hookrun.store import CaptureMeta, RowKind
from hookrun.store.listing import damage, list_captures, matches, row_index
from hookrun.store.reading import open_source

if TYPE_CHECKING:
    from hookrun.hooks.actions import ActionEnv


@register_op("patch")
def patch(source: str, hook: str | None = None, module: str | None = None, role: str | None = None, *,
          build: OpBuild):
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{build.where}: patch needs source: PATH of an earlier run's captures.h5, got {source!r}")
    point = build.point
    return PatchSource(source, hook, module if module is not None else point.module, role, build.family, point.hook, build.env)


class PatchSource:
    def __init__(self, source: str, hook: str | None, module: str, role: str | None, family: str,
                 this_hook: str, env: ActionEnv | None) -> None:
        where = f"hooks.{this_hook}: patch source {source!r}"
        try:  # a local file (a merged view of ranks: its shards checked), or an object store's parts, fetched
            self.source = open_source(source)
            self.file = self.source.file
        except NotFoundError as exc:
            raise ConfigError(f"{where}: {exc} (run the clean run first, or fix the path)") from None
        except HookrunError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if env is not None:
            env.hold.on_close(self.source.close)
        try:
            captures = list_captures(self.file)
        except HookrunError as exc:
            raise ConfigError(f"{where}: {exc}; run the clean run again (or point source: at an intact copy)") from None
        available = [f"{c.hook}/{module_label(c.module)}/{c.role}" for c in captures]
        found = [self.file[c.path] for c in captures
                 if matches(c, hook, module, role or family, family=role is None)]
        if not found:
            listing = ", ".join(sorted(set(available))[:12]) or "none"
            want = f"module {module!r}, role {role or family!r}" + (f", hook {hook!r}" if hook else "")
            raise ConfigError(f"{where} has no capture of {want}; it has (hook/module/role): {listing}")
        hooks = sorted({ds.attrs["hook"] for ds in found})
        if len(hooks) > 1:
            raise ConfigError(f"{where}: several hooks recorded {module!r}; set hook: to one of {', '.join(hooks)}")
        self.columns: dict[tuple[str, int], tuple[h5py.Dataset, dict[int, int]]] = {}
        planned = env.planned_samples if env is not None else None
        for ds in found:
            try:
                self._add(ds, planned, where)
            except (KeyError, OSError, RuntimeError) as exc:
                raise ConfigError(f"{where}: the capture {ds.name} cannot be read: the file is damaged ({damage(exc)}); "
                                  f"run the clean run again (or point source: at an intact copy)") from None
        self.role = role
        self.where = where
        self.masks = source_masks(self.file)  # (attention_mask dataset, sample index -> its row) or None

    def _add(self, ds: h5py.Dataset, planned: np.ndarray | None, where: str) -> None:
        """One capture of the source: its rows by sample index, every planned sample checked."""
        meta = CaptureMeta.from_attrs(ds.attrs)
        if meta.rows is not RowKind.SAMPLES:
            what = "one row per token (rows: token)" if meta.rows is RowKind.TOKENS else f"rows of {meta.rows.value}"
            raise ConfigError(f"{where}: {ds.name} has {what}, not one per sample; only per-sample captures can be "
                              f"patched in: record the source with rows: sample")
        try:
            index = row_index(self.file, ds)
        except (KeyError, OSError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"{where}: the sample index of {ds.name} ({meta.index or '/samples/index'}) cannot be read: "
                              f"the file is damaged ({damage(exc)}); run the clean run again (or point source: at an intact copy)") from None
        rowmap = {int(i): r for r, i in enumerate(index)}
        if planned is not None:
            missing = np.setdiff1d(planned, index)
            if len(missing):
                raise ConfigError(f"{where}: {ds.name} lacks sample index {', '.join(map(str, missing[:5]))}"
                                  f"{' ...' if len(missing) > 5 else ''} ({len(missing)} of this run's samples)")
        self.columns[(meta.role, meta.call)] = (ds, rowmap)

    def __call__(self, x: torch.Tensor, ctx: OpContext) -> torch.Tensor:
        if getattr(ctx.tokens, "call", 0):  # hookrun.capture around model.generate: a new token's pass
            raise RunError(f"{self.where}: op patch replaces the prompt pass of model.generate only (the source has no "
                           f"rows for new tokens); give the action positions: prompt")
        key = (self.role or ctx.role, ctx.call)
        if key not in self.columns:
            raise RunError(f"{self.where} has no capture for role {key[0]!r} call {key[1]}")
        ds, rowmap = self.columns[key]
        try:
            rows = np.array([rowmap[int(i)] for i in ctx.sample_index])
        except KeyError as exc:
            raise RunError(f"{self.where}: {ds.name} lacks sample index {exc.args[0]}") from None
        try:
            data = _read_rows(ds, rows)
        except (OSError, RuntimeError) as exc:  # a damaged chunk (or a failed checksum)
            raise RunError(f"{self.where}: the capture {ds.name} cannot be read at samples "
                           f"{ctx.sample_index.tolist()[:5]}: the file is damaged ({damage(exc)})") from None
        new = torch.from_numpy(data).to(device=x.device, dtype=x.dtype)
        valid = getattr(ctx.tokens, "valid", None)
        if self.masks is None or valid is None or new.dim() < 2 or tuple(x.shape[:2]) != tuple(valid.shape):
            return new
        ds, at = self.masks
        try:
            source = torch.as_tensor(_read_rows(ds, np.array([at[int(i)] for i in ctx.sample_index]))).bool()
        except KeyError:  # (a sample the capture has but /samples does not: rows as they are)
            return new
        return aligned(new, source, valid.to(torch.bool), x, self.where, ctx.sample_index)


def source_masks(file: h5py.File) -> tuple[h5py.Dataset, dict[int, int]] | None:
    """The source's /samples/attention_mask (stored by data=text) and the row of each sample index in it."""
    samples = file.get("samples")
    if samples is None or "attention_mask" not in samples or "index" not in samples:
        return None
    mask, index = samples["attention_mask"], samples["index"][:]
    if mask.ndim != 2 or mask.shape[0] != len(index):
        return None
    return mask, {int(i): r for r, i in enumerate(index)}


def aligned(new: torch.Tensor, source: torch.Tensor, valid: torch.Tensor, x: torch.Tensor, where: str,
            sample_index: torch.Tensor) -> torch.Tensor:
    """The source's rows `new` (B, Ts, ...) token for token on this batch's real tokens: the k-th real token
    of a sample gets the source's k-th real token, this batch's padding keeps x's values. Prompts of other
    lengths padded on the same side keep the rows as they are (aligned at the side without padding)."""
    valid = valid.to(new.device)
    source = source.to(new.device)
    if new.shape[1] != source.shape[1] or (tuple(source.shape) == tuple(valid.shape) and bool((source == valid).all())):
        return new  # the same padding: the rows as they are
    counts, here = source.sum(1), valid.sum(1)
    if bool((counts != here).any()):
        if tuple(source.shape) == tuple(valid.shape) and bool((source[:, 0] == valid[:, 0]).all() | (source[:, -1] == valid[:, -1]).all()):
            return new  # (other prompts, padded on the same side: as before, column for column)
        b = int((counts != here).nonzero()[0, 0])
        raise RunError(f"{where}: sample {int(sample_index[b])} has {int(counts[b])} real tokens in the source and "
                       f"{int(here[b])} here, padded on the other side; patch a run of the same prompts, or pad "
                       f"both on one side (data.dataset.padding_side)")
    out = x.clone()
    out[valid] = new[source]  # (both in order: sample, then position)
    return out


def _read_rows(ds: h5py.Dataset, rows: np.ndarray) -> np.ndarray:
    """ds[rows] for any order: a slice when contiguous, else sorted fancy indexing, unsorted back."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and np.all(np.diff(rows) == 1):
        return ds[int(rows[0]) : int(rows[-1]) + 1]
    order = np.argsort(rows)
    data = ds[rows[order]]
    out = np.empty_like(data)
    out[order] = data
    return out
