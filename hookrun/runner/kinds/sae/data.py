"""The rows an SAE trains on: a cache run's capture as an endless stream of [batch_rows, d_in] batches.

    rows = CacheRows("outputs/h3_cache", "res/transformer.h.3/output", batch_rows=4096,
                     shuffle={"buffer_rows": 1_000_000, "seed": 0})
    x = next(iter(rows))        # torch.float32, (4096, d_in)

The capture is read with the cache loader (hookrun.analysis.loader for a local folder or file,
output/objects/parts_loader for an s3:// URL): with `shuffle`, epoch e's order is the loader's seeded order for
(seed, e) with a window of `buffer_rows` rows (blocks of about one HDF5 chunk in a random order,
each window's rows permuted), so memory is two windows plus a batch whatever the number of rows;
`shuffle=False` is the cache's own row order. `vectors="channel"` (the block's `rows: channel`) reads a feature map
(sample, channel, positions...) as one row per position: its channel vector (the last axis of a capture whose
dims are sample, height, width, channel: a channels-last map; a sample's positions
stay together, in row-major order, and the shuffle moves whole samples). When the stream runs past the cache's rows it goes on
with the next epoch (a new order); a batch may span two epochs (more where the cache holds fewer rows than a
batch: its rows repeat in it), so every batch holds exactly
`batch_rows` rows. Token rows of a cache hold only real tokens (the record action writes no
padding row), so padding never enters. `skip(n)` drops the first n batches (a resumed run). A
capture whose recording overflowed (a float16 cache's `overflow_values` above 0) is one ConfigError
line when it is opened, before any step; a batch with a NaN or inf all the same (as the model gave
them, or an object store's cache, whose manifest holds no count) is one RunError line before the
trainer sees it: an SAE trained on it has NaN weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookrun.analysis.images import channels_last
from hookrun.analysis.opening import open_run
from hookrun.errors import ConfigError, HookrunError, NotFoundError, RunError, close_matches
from hookrun.store.paths import local_path, scheme_of


class BatchStream:
    """An endless iterator over `self._stream()` (a generator of batches), counting them: what the
    trainer is fed, from a cache (CacheRows) or from the model on the fly (live.py's LiveRows)."""

    _it: Iterator[torch.Tensor] | None = None
    batches: int = 0

    def _stream(self) -> Iterator[torch.Tensor]:
        raise NotImplementedError

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> torch.Tensor:
        if self._it is None:
            self._it = self._stream()
        self.batches += 1
        batch = next(self._it)
        if not bool(torch.isfinite(batch).all()):
            bad = ~torch.isfinite(batch)
            kinds = ", ".join(k for k, n in (("NaN", torch.isnan(batch)), ("inf", torch.isinf(batch))) if bool(n.any()))
            raise RunError(f"sae: training batch {self.batches - 1} holds {int(bad.sum())} non-finite value(s) ({kinds}) "
                           f"in {int(bad.any(1).sum())} of its {len(batch)} rows; an SAE trained on it has NaN weights: "
                           f"{self.why_not_finite()}")
        return batch

    def why_not_finite(self) -> str:
        return "the rows hold them as they came"

    def skip(self, n: int) -> None:
        """Drop the next n batches (a resumed run: the steps already trained; live rows run their forwards again)."""
        for _ in range(n):
            next(self)

    def close(self) -> None:
        self._it = None


class CacheRows(BatchStream):
    """An endless iterator of float32 batches of one capture of a cache run (see the module doc)."""

    def __init__(self, source: str, capture: str, batch_rows: int, shuffle: dict | bool, vectors: str = "auto") -> None:
        self.source, self.capture, self.batch_rows, self.shuffle = str(source), capture, batch_rows, shuffle
        self.run = open_cache(self.source)
        self.info = find_capture(self.run, capture, self.source)
        shape = tuple(int(n) for n in self.info.shape)
        self.channel = vectors == "channel"
        if len(shape) < 2:  # (a number per row: no layout makes vectors of it)
            named = [c.path.removeprefix("/captures/") for c in self.run.captures if len(c.shape) >= 2]
            self.run.close()
            raise ConfigError(f"sae.capture: {capture} holds one number per row (shape {shape}), not a vector: an SAE "
                              "trains on vectors; give sae.capture a capture of vectors" + (
                                  f" (this cache's: {', '.join(named[:8])}{' ...' if len(named) > 8 else ''})" if named
                                  else f" ({self.source} holds none: give sae.from a cache run that records a module's "
                                  "output with rows: token, e.g. experiment=sae_cache)"))
        if tuple(getattr(self.info, "dims", None) or ())[1:2] == ("token",):  # (not a feature map: tokens, padding too)
            self.run.close()
            raise ConfigError(f"sae.capture: {capture} holds a sequence per row (sample, token, feature: shape "
                              f"{shape[1:]}, padding included), not a token's vector or a feature map; record it with "
                              "rows: token (a row per real token, as experiment=sae_cache does), or give sae.at (on the fly)")
        if self.channel and len(shape) < 3:
            self.run.close()
            raise ConfigError(f"sae.rows: channel reads a feature map (sample, channel, positions...); {capture} "
                              f"has rows of shape {shape[1:]}: give rows: token (its rows are the vectors)")
        if not self.channel and len(shape) != 2:
            self.run.close()
            raise ConfigError(f"sae.capture: {capture} has rows of shape {shape[1:]}; an SAE trains on vectors: "
                              "give sae.rows=channel with sae.budget (a feature map's channels at each position), or record "
                              "with rows: token")
        if (overflow := overflow_count(self.run, self.info.path, self.source)) > 0:  # (known bad before any step)
            self.run.close()
            raise ConfigError(f"sae.from: {self.source}'s capture {capture} holds {overflow} inf value(s) its "
                              f"{np.dtype(self.info.dtype)} recording overflowed (above 65504; its overflow_values "
                              "attribute): an SAE trained on them has NaN weights; record the cache again with "
                              "dtype: float32 or bfloat16")
        # a channels-last map (its dims sample, height, width, channel: timm's Swin) gives its last axis
        self.last = self.channel and channels_last(self.info)
        self.per_sample = int(np.prod(shape[1:-1] if self.last else shape[2:])) if self.channel else 1  # rows a stored row gives
        self.n_rows, self.d_in = shape[0] * self.per_sample, shape[-1] if self.last else shape[1]
        if self.n_rows == 0:
            self.run.close()
            raise ConfigError(f"sae.from: {self.source}'s capture {capture} holds no rows")
        row_bytes = int(np.prod(shape[1:])) * np.dtype(self.info.dtype).itemsize  # one stored row
        buffer = -(-(shuffle["buffer_rows"] if shuffle else 1_000_000) // self.per_sample)
        self.loader = self.run.loader(self.info.path.removeprefix("/captures/"),
                                      batch_size=max(1, batch_rows // self.per_sample),
                                      shuffle=bool(shuffle), seed=shuffle["seed"] if shuffle else 0,
                                      buffer_bytes=max(1, buffer) * row_bytes, dtype=torch.float32)
        self.epochs = 0  # epochs started so far
        self.batches = 0  # batches handed out
        self._it: Iterator[torch.Tensor] | None = None

    def why_not_finite(self) -> str:
        where = f"the cache's {self.capture} ({self.source})"
        if np.dtype(self.info.dtype) == np.float16:
            return (f"{where} is float16, which stores a value above 65504 as inf (its overflow_values attribute "
                    "counts them); record it again with dtype: float32 or bfloat16")
        return f"{where} holds them as recorded (record with check_finite: true to stop where they arise)"

    def epochs_for(self, rows: int) -> int:
        """How many passes over the cache `rows` training rows take."""
        return -(-rows // self.n_rows)

    def _stream(self) -> Iterator[torch.Tensor]:
        """Exact batches, each epoch in its own order, a batch spanning two epochs where it must."""
        carry: list[torch.Tensor] = []
        have = 0
        epoch = 0
        while True:
            self.loader.set_epoch(epoch)
            self.epochs = epoch + 1
            for x in self.loader:
                if self.channel:  # (samples, C, positions...) -> a C-vector per position, sample by sample
                    x = (x if self.last else x.movedim(1, -1)).reshape(-1, self.d_in)
                if not carry and len(x) == self.batch_rows:
                    yield x
                    continue
                carry.append(x)
                have += len(x)
                while have >= self.batch_rows:
                    joined = torch.cat(carry)
                    yield joined[: self.batch_rows]
                    rest = joined[self.batch_rows :]
                    carry, have = ([rest] if len(rest) else []), len(rest)
            epoch += 1

    def close(self) -> None:
        super().close()
        self.run.close()


def open_cache(source: str) -> Any:
    """The cache run, refused in one line unless it is there and complete."""
    local = None if scheme_of(source).remote else Path(local_path(source)).expanduser()
    if local is not None and not local.exists() and not local.parent.exists():  # no cache made there yet (a
        # folder that exists may hold a killed run's parts, which open_run names)
        raise ConfigError(f"sae.from: no file {source!r} (relative to {os.getcwd()}); record the cache first "
                          f"(python -m hookrun experiment=sae_cache hydra.run.dir=FOLDER, or any run that records "
                          f"the module) and give sae.from=FOLDER/captures.h5")
    try:
        run = open_run(source)
    except HookrunError as e:
        raise ConfigError(f"sae.from: {source}: {e}") from None
    status = getattr(run, "status", "complete")
    if status != "complete":
        run.close()
        raise ConfigError(f"sae.from: {source} is a cache run whose status is {status!r}, not complete; finish it "
                          "(resume=true) or train on a complete cache")
    return run


def find_capture(run: Any, capture: str, source: str) -> Any:
    """The capture's info; a capture the cache lacks is one line with the closest it holds."""
    try:
        return run.find(capture)
    except (NotFoundError, KeyError, ValueError):
        names = [c.path.removeprefix("/captures/") for c in run.captures]
        near = close_matches(capture, names)
        kind = run.attrs.get("kind") if not names and hasattr(run, "attrs") else None
        run.close()
        if not names:  # (a probe or similarity run, say: a run of another kind holds no captures)
            raise ConfigError(f"sae.capture: {source} holds no captures{f' (a {kind} run)' if kind else ''}; give "
                              f"sae.from a cache run (experiment=sae_cache, or any run that records the module)") from None
        raise ConfigError(f"sae.capture: {source} has no capture {capture!r}"
                          + (f"; did you mean {near[0]!r}?" if near else "")
                          + f" (it holds: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''})") from None


def hook_name(info: Any) -> str:
    """The SAE's cfg.json hook_name: the capture's module where its rows are that module's output (where
    op: splice puts an SAE), MODULE/ROLE where they are another of its tensors (transformer.h.3/input.0,
    a second call's output@1, a gradient), which op: splice refuses at the module's output."""
    role = info.role + (f"@{info.call}" if info.call else "")
    return info.module if role == "output" else f"{info.module}/{role}"


BUILT_BY = {"hookrun.models.hf": ("path", "model_class"), "hookrun.models.timm_model": ("name",)}  # builders of many


def model_name(node: Any) -> str | None:
    """The SAE's cfg.json model_name (SAELens' key: the model whose activations it reads) from the `model:` node of
    the run that gave the rows: a transformers model's folder (model.path) or class, timm's model name, else the
    builder's `_target_` (torchvision.models.resnet18) or a live model's class (its `live` node); None without one."""
    get = node.get if isinstance(node, Mapping) else lambda key, default=None: getattr(node, key, default)
    target = get("_target_")
    named = [str(get(key)) for key in BUILT_BY.get(str(target), ()) if get(key)] + [str(n) for n in (target, get("live")) if n]
    return named[0] if named else None


def sae_meta(rows: Any, module: str, model: Any) -> dict[str, str | None]:
    """The SAE's cfg.json metadata: hook_name (above; a module trained on the fly: `module`) and model_name, of the
    run whose `model:` gave the rows (the cache's; on the fly, this run's `model`)."""
    info = getattr(rows, "info", None)
    if info is None:
        return {"hook_name": module, "model_name": model_name(model)}
    return {"hook_name": hook_name(info), "model_name": model_name((rows.run.config or {}).get("model"))}


def spliced_arg(rows: Any) -> int | str | None:
    """The `arg` op: splice needs to put the SAE back on the tensor its rows are: N for a cache's capture of
    a tuple's part output.N (KEY for a dict's output.KEY), 0 for a module trained on the fly whose output is a
    tuple (its first element, live.py), None for a module's whole output."""
    info = getattr(rows, "info", None)
    if info is None:
        return getattr(rows, "part", None)
    part = info.role.removeprefix("output.") if info.role.startswith("output.") else None
    return int(part) if part is not None and part.isdigit() else part


def check_spliced_at_output(info: Any, capture: str) -> None:
    """sae.evaluate splices the SAE at its module's output (a tuple's part with arg): a capture of another
    tensor (its input, a gradient, a second call's output) is one line."""
    if (name := hook_name(info)) != info.module and not (info.role.startswith("output.") and not info.call):
        role = name.rsplit("/", 1)[-1]
        raise ConfigError(f"sae.evaluate: the capture {capture} is {info.module}'s {role}, but the evaluation splices "
                          f"the SAE at {info.module}'s output; train on a module's output "
                          f"({capture.rsplit('/', 1)[0]}/output) or drop sae.evaluate (op: splice with other_module: "
                          "true splices it where you choose)")


def overflow_count(run: Any, path: str, source: str) -> int:
    """The inf values the cache's recording cast made of finite ones (`overflow_values`, summed over a
    merged view's shard files); an object store's manifest does not hold it (0: the batch check stays)."""
    if scheme_of(source).remote:
        return 0
    return sum(int(f[path].attrs.get("overflow_values", 0)) for f in run.part_files() if path in f)
