"""The data loop: batches in, the run kind's step per batch, step records out.

    loader = make_loader(ds, batch_size=16, num_workers=0)   # yields (indices, batch): items with their dataset index
    loader = make_loader(ds, 2, 0, collate=collate_lists)    # items of different sizes, as lists
    steps = run_batches(model, loader, session, writer, env, settings)   # settings.batches: which ones

What a batch does (one forward, forward and backward, generate(), a block kind's forwards) is the run
kind's (hookrun.runner.kinds, `settings.kind`); the loop never asks which kind runs.

What the end of a run reports (end_report): hooks that never fired, and values a cast turned into
inf. A hook whose module never ran leaves no capture, which looks like success: it is named in the
log and in the file's `hooks_not_fired` attribute. A capture stored as float16 whose values
exceeded float16's range holds inf: the count is in the log and in the capture's `overflow_values`
(nonzero values below its smallest subnormal, 6e-8, hold 0: `underflow_values`)
(`attrs = end_report(session, store, resume); store.set_attrs(attrs)`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from hookrun.config.schema import Mode
from hookrun.errors import ConfigError, HookrunError, RunError, module_label
from hookrun.hooks import HOOK_TYPES
from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.session import HookSession, warn_cast, warn_never_fired
from hookrun.runner.calls import CallSpec, Collate
from hookrun.runner.kinds import RunKind, StepAdds
from hookrun.store.records import RunStore, StepRecord, check_rows
from hookrun.store.writer import BackgroundWriter, HostTransfer

if TYPE_CHECKING:
    from hookrun.output.resume import Resume


@dataclass
class LoopSettings:
    kind: RunKind  # what a batch does (hookrun.runner.kinds): its forwards and what they add
    device: torch.device
    batches: range | None = None  # the batch numbers to run (data.limit applied; a rank's shard); None: all
    progress: bool = True
    label: str = "hookrun"  # the progress bar's label (a rank's: "hookrun rank 0/2, batches 0-4")
    should_stop: Callable[[], bool] = lambda: False  # checked after each batch (signals)
    spec: CallSpec = field(default_factory=CallSpec)  # how a batch becomes the forward call
    store_keys: tuple[str, ...] = ()  # batch keys stored per sample under /samples/ (data.store)
    store_mask: bool = False  # /samples/attention_mask from the call's mask, data.store naming it or not (a lens)
    positions: tuple[int, str] | None = None  # the model's learned positions (calls.position_limit): each batch checked

    @property
    def mode(self) -> Mode:
        return self.kind.ctx.cfg.mode


def run_batches(
    model: nn.Module, loader, session: HookSession, writer: BackgroundWriter, env: ActionEnv, s: LoopSettings,
    start: int | None = None,
) -> int:
    """Run the batches of `s.batches` from batch number `start` on (default: the range's first; a
    resumed run starts past the batches it has)."""
    transfer = HostTransfer(s.device)
    if session.early_stop is not None and not session.early_stop.learned:
        probe_stop(model, loader, session, s)
    batches = range(len(loader)) if s.batches is None else s.batches
    first = batches.start if start is None else start
    dataset = loader.dataset.dataset  # under the Indexed wrapper
    stop = batches.stop * loader.batch_size  # (data.limit's, or a rank's, last batch: no item after it is read)
    if first or stop < len(dataset):
        loader = make_loader(dataset, loader.batch_size, loader.num_workers, start=first * loader.batch_size,
                             collate=loader.collate_fn.fn if loader.collate_fn.custom else None, stop=stop)
    steps = 0
    with tqdm(total=len(batches), initial=first - batches.start, disable=not s.progress, unit="batch", desc=s.label,
              dynamic_ncols=True) as bar:
        for step, (indices, batch) in enumerate(one_line_errors(loader), start=first):
            if step >= batches.stop:
                break
            call = s.spec.split(batch)
            if s.positions is not None:  # (a later item longer than the first: one line, not the embedding's IndexError)
                from hookrun.runner.token_inputs import check_positions

                check_positions(model, call.batch if isinstance(call.batch, Mapping) else call.kwargs, s.positions,
                                f"batch {step} (items {int(indices[0])}..{int(indices[-1])}) holds")
            target, mask = call.target, call.attention_mask
            # what /samples keeps, copied before the forward: a model may change its inputs in place (x.sub_(mean))
            stored = stored_keys(batch, s.store_keys)
            if s.store_mask and isinstance(mask, torch.Tensor) and mask.dim() == 2 and "attention_mask" not in (stored or {}):
                stored = {**(stored or {}), "attention_mask": host_copy(mask)}
            target = host_copy(target) if isinstance(target, torch.Tensor) else None
            call = call.to(s.device)
            session.begin_step(step, len(indices), indices, call.attention_mask, call.batch)
            adds = s.kind.step(model, call, session)
            session.end_step()
            if not isinstance(adds, StepAdds):  # (a user's kind: its step returns what the batch adds)
                raise RunError(f"the {s.kind.name} kind's step() returned {type(adds).__name__}; it returns a StepAdds "
                               f"(NOTHING, hookrun.runner.kinds, where the batch adds no column or table)")
            if not steps:
                refuse_only_skipped(session)
            captures = env.captures.take()
            check_rows(captures, len(indices), {p.hook for p in session.points},  # (a user's action or kind may hand anything)
                       f"the {s.kind.name} kind ({type(s.kind).__module__}.{type(s.kind).__qualname__})")
            writer.put(StepRecord(
                step=step,
                sample_index=indices.numpy(),
                target=target,
                path=sample_paths(dataset, indices.tolist()),
                captures=captures,
                ticket=transfer.submit(captures),
                samples=stored if adds.samples is None else {**(stored or {}), **adds.samples},
                tokens=step_tokens(captures, env.state, adds.generated),
                token_width=token_width(s.kind, call),  # (the store's chunks of token rows: store/__init__.py)
                tables=adds.tables,
                state=env.snapshot(),  # stateful actions (top_examples): saved at the next flush
            ))
            steps += 1
            bar.update()
            if s.should_stop():
                break
    return steps


class Indexed(Dataset):
    """Wraps a dataset so each item comes with its index: the loader yields (indices, batch).
    `start` skips the first items (a resumed run), `stop` ends before item `stop` (data.limit's batches:
    no item past them is read, by a worker's prefetch either); the indices stay the dataset's own."""

    def __init__(self, dataset: Dataset, start: int = 0, stop: int | None = None) -> None:
        self.dataset = dataset
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        end = len(self.dataset) if self.stop is None else min(self.stop, len(self.dataset))
        return max(0, end - self.start)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return self.start + i, self.dataset[self.start + i]


def make_loader(dataset: Dataset, batch_size: int, num_workers: int, start: int = 0,
                collate: Callable | None = None, stop: int | None = None) -> DataLoader:
    if batch_size < 1:
        raise ConfigError(f"data.batch_size must be at least 1, got {batch_size}")
    if num_workers < 0:
        raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}")
    return DataLoader(Indexed(dataset, start, stop), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      collate_fn=Collate(collate))


def sample_paths(dataset: Dataset, indices: list[int]) -> list[str] | None:
    """The file path of each sample, where the dataset keeps them (ImageFolder's `samples`)."""
    samples = getattr(dataset, "samples", None)
    if not isinstance(samples, list | tuple) or not samples:
        return None
    first = samples[0]
    if isinstance(first, tuple | list) and first and isinstance(first[0], str):
        return [samples[i][0] for i in indices]
    if isinstance(first, str):
        return [samples[i] for i in indices]
    return None


def refuse_only_skipped(session: HookSession) -> None:
    """After the first batch: an action whose glob reached only modules it skips (none returns the tensor
    `what` names) would record nothing, and the run end 'complete' and empty: refused, naming why."""
    groups: dict[tuple, list] = {}
    for p in session.points:
        for i, a in enumerate(p.actions):
            groups.setdefault((p.hook, i), []).append(a)
    for actions in groups.values():
        if all(a.skipped for a in actions):
            a = actions[0]
            raise RunError(f"{a.where}: every module `at:` reaches is skipped, so nothing would be recorded; "
                           f"{a.skipped}")


def probe_stop(model: nn.Module, loader, session: HookSession, s: LoopSettings) -> None:
    """early_stop learns where to cut from one sample (the dataset's first item), with every action
    muted; then no batch, the first included, computes what the captures do not need."""
    from hookrun.runner.extra_forwards import first_batch

    indices, call = first_batch(loader, s.spec)
    call = call.to(s.device)
    with session.probe(indices, call.attention_mask, model, call.batch):
        s.kind.probe(model, call)


def one_sample_forward(model: nn.Module, loader, s: LoopSettings) -> None:
    """The dataset's first item through the model once under no_grad, with nothing of the run's
    hooked (hooks/site_check.py listens to it): the kind's sample_forward (generate: two new tokens)."""
    from hookrun.runner.extra_forwards import first_batch

    _, call = first_batch(loader, s.spec)
    s.kind.sample_forward(model, call.to(s.device))


def stored_keys(batch: Any, keys: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The batch's tensors named by data.store, as host arrays (one row per sample); prepare asks it of
    the first item's batch, so a key the items lack is refused before the file opens."""
    if not keys:
        return None
    if not isinstance(batch, Mapping):
        raise ConfigError(f"data.store={list(keys)} names keys of dict items, but a batch is a {type(batch).__name__} "
                          f"(tuple or tensor items have no keys); remove data.store (data.store=[])")
    out = {}
    for k in keys:
        v = batch.get(k)
        if not isinstance(v, torch.Tensor):
            raise ConfigError(f"data.store: the batch has no tensor {k!r}; its keys: {', '.join(map(str, batch))}")
        out[k] = host_copy(v)
    return out


def one_line_errors(loader) -> Any:
    """The loader's batches; a hookrun error raised in a worker process (a collate error) comes
    back as its own one line, not as the worker's traceback text; any other error of the data (a
    dataset item that raises) as one RunError line naming the batch and its items."""
    it = iter(loader)
    step = loader.dataset.start // loader.batch_size  # (a resumed run's loader starts past its batches)
    while True:
        try:
            yield next(it)
        except StopIteration:
            return
        except HookrunError as exc:
            text = str(exc)
            if "DataLoader worker" not in text:
                raise
            last = [ln for ln in text.strip().splitlines() if ln.startswith("hookrun.errors.")]
            raise type(exc)(last[-1].split(": ", 1)[1] if last else text.strip().splitlines()[-1]) from None
        except Exception as exc:
            from hookrun.runner.data_errors import load_failure

            raise load_failure(exc, step, loader) from exc
        step += 1


def host_copy(t: torch.Tensor) -> np.ndarray:
    """A host array of its own (a CPU tensor's .numpy() would share the tensor's memory)."""
    return t.detach().to("cpu", copy=True).numpy()


log = logging.getLogger("hookrun")


def token_width(kind: RunKind, call: Any) -> int | None:
    """Token rows a sample of the batch can get at most: the kind's (generate: the prompt and the new
    tokens), else the batch's padded width; None without an attention mask (every token is real)."""
    if n := kind.token_rows(call):
        return n
    mask = call.attention_mask
    return int(mask.shape[1]) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None


def step_tokens(captures: list, state: Any, with_generated: bool) -> tuple | None:
    """The step's /samples/token_* columns (hooks/tokens.py's token_columns, loaded where a capture
    has token rows); None where none has."""
    if not any(c.tokens for c in captures):
        return None
    from hookrun.hooks.tokens import token_columns

    return token_columns(captures, state, with_generated=with_generated)


def end_report(session: HookSession, store: RunStore, resume: Resume | None, complete: bool = True) -> dict:
    warn_cast(store.overflow_by_key(), store.underflow_by_key())
    unfired = {f"{p.hook}@{p.module}" for p in session.never_fired()}
    if resume is not None:  # hooks that fired in the batches kept from the old file count as fired
        recorded = {f"{key[0]}@{key[1]}" for key in store.rows_by_key()}
        old = resume.attrs.get("hooks_not_fired")
        unfired -= recorded
        if old is not None:
            unfired &= set(filter(None, str(old).split(", ")))
    names = sorted(unfired)
    grads = {f"{p.hook}@{p.module}" for p in session.points if HOOK_TYPES.get(p.type).needs_grad}
    for name in names if complete else ():  # (a run that stopped early may not have reached them)
        hook, module = name.split("@", 1)
        warn_never_fired(hook, module, needs_grad=name in grads)  # (a gradient hook's module may have run under no_grad)
    skipped = {}
    for p in session.points:
        why = next((a.skipped for a in p.actions if a.skipped), None)
        if why:
            skipped[f"{p.hook}@{p.module}"] = why
            log.warning("hook %r: skipped %s, which a glob of `at:` reached: %s", p.hook, module_label(p.module), why)
    return {"hooks_not_fired": ", ".join(names), "hooks_skipped": "; ".join(f"{k} ({v})" for k, v in skipped.items())}
