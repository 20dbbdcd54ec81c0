"""record: snapshot the tensors a hook sees and hand them to the writer.

    actions: [record]                                   # every tensor the hook sees
    actions: [{name: record, what: output}]             # only the output (or [input, output], input.1)
    actions: [{name: record, what: output, reduce: mean, dims: spatial, dtype: float16, every: 2}]
    actions: [{name: record, what: input.hidden_states, rows: token}]   # a keyword input, one row per token
    actions: [{name: record, what: output, select: {dim: token, index: last}}]  # each sample's last token
    actions: [{name: record, what: output, dim_names: [head, query, key]}]      # the axes' names in the file

Reductions run on the tensor's device before the copy, in this order (hookrun.hooks.actions.reduction, loaded where asked): `select`
(index lists or slices along named dims), `reduce` (mean / max / norm over `dims`), `dtype`; `every` keeps every Nth
step, `limit` the first N rows. The capture's attributes record what was done. `rows` says how a tensor becomes rows
(auto | sample | step | token: hookrun.hooks.actions.rows); a reduction over the token dim and `index: last` follow
the batch's attention mask (padding is left out). Each capture's axes are named by meaning at its first batch
(hookrun.hooks.actions.rows.meaning: `sample, head, query, key` for an attention pattern, `token, feature` for token
rows, ...), or by `dim_names` (one name per axis of a row); the names become the dataset's `dims` attribute. A
snapshot is a copy taken when the hook fires, so a later in-place op (ReLU(inplace=True) after bn1) cannot change what
was recorded.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hookrun.config.schema import DTYPES, Mode
from hookrun.errors import ConfigError, HookrunError, RunError, one_of
from hookrun.hooks import Event, family
from hookrun.hooks.actions import ACTIONS, Action
from hookrun.hooks.actions.rows import (
    STEP,
    RowRule,
    axis_names,
    check_finite,
    check_names,
    dtype_name,
    narrows,
    snapshot,
)
from hookrun.store.records import Capture, CaptureKey

log = logging.getLogger("hookrun")


@ACTIONS.register("record")
class Record(Action):
    records = True
    def __init__(
        self, point, hook_type, env, where: str = "",
        what: str | list[str] | None = None,
        dtype: str | None = None, reduce: str | None = None, dims: Any = None, select: Any = None,
        every: int = 1, limit: int | None = None,
        check_finite: bool = False,
        rows: str = "auto",
        dim_names: list[str] | None = None,
    ) -> None:
        super().__init__(point, hook_type, env, where)
        wanted = [what] if isinstance(what, str) else list(what or [])
        for w in wanted:
            if family(w) not in hook_type.roles:
                raise ConfigError(f"{self.where}: record what={w!r} is not something a {hook_type.name} hook sees; "
                                  f"choose from: {one_of(hook_type.roles)}")
        self.what = tuple(wanted)
        # inputs named by argument (input.hidden_states) that may come positionally: their positions
        named = [w for w in wanted if family(w) == "input" and "." in w and not w.split(".", 1)[1].isdigit()]
        if named:  # (hookrun.hooks.roles: loaded where a record names an input by argument)
            from hookrun.hooks.roles import positional_index
        self.named = {w: positional_index(point.target, w.split(".", 1)[1]) for w in named}
        self.named = {w: i for w, i in self.named.items() if i is not None}
        if dtype is not None and dtype not in DTYPES:
            raise ConfigError(f"{self.where}: record dtype={dtype!r}; choose from: {one_of(DTYPES)}")
        self.dtype = DTYPES[dtype] if dtype is not None else env.store_dtype
        if reduce is not None or dims is not None or select is not None:  # (loaded where a record names one)
            from hookrun.hooks.actions.reduction import REDUCERS, check_dim, parse_selects
        if reduce is not None and reduce not in REDUCERS:
            raise ConfigError(f"{self.where}: record reduce={reduce!r}; choose from: {one_of(REDUCERS)}")
        if dims is not None and reduce is None:  # (select picks along a dim; dims are what reduce reduces)
            raise ConfigError(f"{self.where}: record dims={dims!r} does nothing without reduce; add reduce (choose from: "
                              f"{one_of(REDUCERS)}), or remove dims")
        self.reduce = reduce
        self.dims = ["spatial"] if dims is None else [check_dim(d, self.where) for d in (dims if isinstance(dims, list | tuple) else [dims])]
        self.selections = parse_selects(select, self.where) if select is not None else []
        self.checks_tensor = bool(self.selections)  # (runner/action_state: checked in one sample's forward)
        if not isinstance(every, int) or every < 1:
            raise ConfigError(f"{self.where}: record every={every!r}; expected a whole number >= 1")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"{self.where}: record limit={limit!r}; expected a whole number >= 1 or null")
        self.every, self.limit, self.check_finite = every, limit, check_finite
        self.rule = RowRule(rows, self.where, hook_type.per_step, env)
        rows = self.rule.rows  # (rows: samples / tokens, the words the file's attribute uses, are sample / token)
        if rows == "token" and (every > 1 or limit is not None):
            raise ConfigError(f"{self.where}: rows=token keeps every token of every batch; remove every and limit "
                              f"(data.limit runs fewer batches)")
        self.token_rows = rows == "token"
        self.dim_names = check_names(dim_names, self.where)
        if self.dim_names is not None and rows == "ragged":
            raise ConfigError(f"{self.where}: dim_names does not fit rows=ragged: a variable-length row is stored "
                              f"flattened, as one axis; remove dim_names")
        self.names: dict[tuple, tuple[str, ...]] = {}  # the stored axes' names, per (site, role, call)
        self.rows: dict[tuple, int] = {}  # rows recorded so far, per (module or op site, role, call)
        self._seen: set[int] = set()  # calls whose roles were checked against `what`
        self._dropped: set[int] = set()  # calls whose tensors not over the tokens were named (rows: token, no what)
        self._kept: dict[tuple, set[str]] = {}  # (module, call): roles kept at the prompt pass (rows: token, no what)
        self._skipped: str | None = None  # a globbed point without the tensors `what` names: why
        self.attrs = self._attrs(dtype)

    def _attrs(self, dtype: str | None) -> dict:
        attrs: dict = {}
        if self.reduce:
            attrs["reduce"] = self.reduce
            attrs["reduce_dims"] = ",".join(map(str, self.dims))
        if self.selections:
            attrs["select"] = "; ".join(f"dim {d}: {label}" for d, _, label in self.selections)
        if self.every > 1:
            attrs["every"] = self.every
        if self.limit:
            attrs["limit"] = self.limit
        if dtype:
            attrs["record_dtype"] = dtype
        return attrs

    def reset(self) -> None:
        """Forget the rows counted for `limit` and the row layouts (after the dry-run estimate)."""
        self.rows.clear()
        self.rule.reset()
        self.names.clear()

    def restore(self, role: str, call: int, rows: int, module: str | None = None) -> None:
        """Count the rows a resumed file already holds, so `limit` stops where it would have
        (`module`: the capture's own name, MODULE/FN.k for one call of an op site MODULE/FN)."""
        self.rows[(module or self.point.module, role, call)] = rows

    def check_mode(self, mode: Mode) -> None:
        if mode is Mode.generate and not self.token_rows:
            raise ConfigError(
                f"{self.where}: record in mode=generate needs rows: token: a hook fires on the prompt (batch, T, ...) and "
                f"then once per new token (batch, 1, ...), so rows of one shape per sample or step cannot hold it")

    def check_tensor(self, role: str, tensor: Any) -> None:  # before any batch: select against one sample's tensor
        if self.selections and self.wants(role) and self.rule.rows != "ragged":
            from hookrun.hooks.actions.reduction import check_selections

            check_selections(tensor, self.selections, self.where, self.point.module, role, family(role) in self.point.last)

    def wants(self, role: str) -> bool:
        return not self.what or any(role == w or role.startswith(w + ".") for w in self.what)

    def __call__(self, ev: Event) -> None:
        """select -> shape -> emit, for each tensor of this firing that the action records."""
        if ev.state.step % self.every:
            return
        for role, t in self.select(ev):
            if isinstance(t, list):
                self._ragged(ev, role, t)
                continue
            rows = self.shape_rows(ev, role, t)
            if rows is not None:
                self.emit(ev, role, *rows)

    def select(self, ev: Event) -> list[tuple[str, Any]]:
        """The (role, tensor) pairs of this firing to record: `what` (inputs named by argument also
        where they came positionally), per-sample lists as ragged rows, and with `rows: token` and
        no `what` only the tensors over the call's tokens."""
        state = ev.state
        tensors: dict = ev.tensors
        if self.named:  # input.hidden_states passed positionally: recorded under its name
            tensors = self._by_name(tensors)
        if self.what and ev.call not in self._seen:
            self._check_seen(ev, tensors)
        if ev.raw is not None:  # a list with one item per sample (detection outputs): ragged rows
            from hookrun.hooks.actions.batch_axis import per_sample_lists

            lists = per_sample_lists(ev.raw, "output", state.batch_size)
            if lists is not None:
                tensors = {r: t for r, t in tensors.items() if family(r) != "output"} | lists
        wanted = [(role, t) for role, t in tensors.items() if t is not None and self.wants(role)]
        kept = wanted
        if self.token_rows and not self.what:  # a new token's pass keeps what the prompt pass kept: a (B, 1, 1, kv) mask looks like (B, 1) tokens
            tokens = state.call_tokens
            kept = [(role, t) for role, t in wanted if isinstance(t, list) or tokens.fits(t, state.batch_size)]
            if getattr(tokens, "call", 0) and (ev.module, ev.call) in self._kept:
                kept = [(role, t) for role, t in kept if role in self._kept[ev.module, ev.call]]
            else:
                self._kept[ev.module, ev.call] = {role for role, _ in kept}
        if len(kept) < len(wanted) and ev.call not in self._dropped:  # (rows: token, no what: said once per call)
            self._dropped.add(ev.call)
            left = ", ".join(f"{r} {tuple(t.shape)}" for r, t in wanted if r not in dict(kept))
            if not kept:
                raise RunError(f"{self.where}: rows: token records the tensors over the call's tokens, and none of "
                               f"{ev.where}'s is (batch, tokens, ...): {left}; name one with what: (and rows: sample)")
            log.warning("%s: rows: token keeps the tensors over the call's tokens; not recorded at %s: %s (name them "
                        "with what: to be told why)", self.where, ev.where, left)
        return kept

    def shape_rows(self, ev: Event, role: str, t: torch.Tensor) -> tuple | None:
        """The tensor as the rows to store (layout, `limit`, select/reduce, token rows), with its
        dtype name, whether it is one row per step, and the rows' sample indices where `limit`
        cut the batch; None where `limit` is reached."""
        state = ev.state
        k = self.rule.layout(ev, role, t, self.point.site is not None)
        per_step = k == STEP
        raw = tuple(t.shape)
        if k > 1:
            t = t.reshape(state.batch_size, k, *t.shape[1:])
        index = None
        if self.limit is not None:
            done = self.rows.get((ev.module, role, ev.call), 0)  # (an op site's calls count apart)
            room = self.limit - done
            if room <= 0:
                return None
            n = 1 if per_step else t.shape[0]
            if not per_step and room < n:
                t = t[:room]
                index = state.sample_index[: len(t)].numpy() if state.sample_index is not None else None
            self.rows[(ev.module, role, ev.call)] = done + min(n, room)
        shaped = self._shape(t, ev, role)
        if self.token_rows:  # the model call's real tokens, one row each
            shaped = state.call_tokens.take(shaped, state.batch_size, role, f"{self.where} at {ev.where}")
        if (ev.module, role, ev.call) not in self.names:  # (ev.module: an op site's calls are MODULE/FN.0, .1, ...)
            self.names[(ev.module, role, ev.call)] = axis_names(self, ev, role, raw, k == STEP, k > 1, shaped)
        return shaped, t.dtype, per_step, index

    def emit(self, ev: Event, role: str, shaped: torch.Tensor, source: torch.dtype, per_step: bool,
             index: Any) -> None:
        """A snapshot in the storage dtype (overflow counted or refused, underflow to 0 counted) handed to the writer."""
        value, torch_dtype = snapshot(shaped, self.dtype, source, self.env.bfloat16), dtype_name(source)
        overflow = underflow = None  # counted without waiting for the device; underflow: float16's smallest is 6e-8
        if narrows(shaped.dtype, value.dtype):  # (a gradient below it is stored as 0)
            overflow, underflow = (torch.isinf(value) & torch.isfinite(shaped)).sum(), ((value == 0) & (shaped != 0)).sum()
        if self.check_finite:
            check_finite(value, ev, role, self.dtype)
        key, attrs = CaptureKey(ev.hook, ev.module, ev.type, role, ev.call), self._attrs_of(value)
        if self.rule.rows == "ragged":  # one variable-length row per step
            self.env.captures.add(Capture(key, [value.cpu()], True, torch_dtype, attrs, ragged=True, dims=("step",)))
            return
        self.env.captures.add(Capture(key, value, per_step, torch_dtype, attrs, index, overflow, underflow=underflow,
                                      tokens=self.token_rows, dims=self.names.get((ev.module, role, ev.call)),
                                      decoder=self.token_rows and getattr(ev.state.call_tokens, "decoder", False)))

    def _by_name(self, tensors: dict) -> dict:
        from hookrun.hooks.roles import positional_role

        out = None
        for w, pos in self.named.items():
            if w not in tensors:
                role = positional_role(tensors, "input", pos)
                if role is not None:
                    out = dict(tensors) if out is None else out
                    out[w] = out.pop(role) if not self.wants(role) else tensors[role]
        return tensors if out is None else out

    def _check_seen(self, ev: Event, tensors: dict) -> None:
        """A `what` that names an input or output the module never receives is an error, not a no-op."""
        self._seen.add(ev.call)
        if self.hook_type.name not in ("forward", "forward_pre", "backward", "backward_pre"):
            return
        for w in self.what:
            if not any(r == w or r.startswith(w + ".") for r in tensors):
                from hookrun.hooks.site_check import missing_role
                why = missing_role(ev.where, ev.target, w, tensors)
                if self.point.globbed:  # a glob reached it: skipped, and listed at the end of the run
                    self._skipped = why
                    continue
                if family(w) != "grad_input" or len(self._seen) < 2:  # (else a looped module's call on data: no row)
                    raise RunError(f"{self.where}: record what={w!r}: {why}")
                log.warning("%s: %s; call %d gets no row, the module's other calls are recorded", self.where, why, ev.call)

    @property
    def skipped(self) -> str | None:
        return self._skipped

    def _ragged(self, ev: Event, role: str, items: list[torch.Tensor]) -> None:
        """One row of varying length per sample (stored as variable-length HDF5 rows)."""
        value = [snapshot(self._shape(x.unsqueeze(0), ev, role), self.dtype, x.dtype, self.env.bfloat16)[0].cpu() for x in items]
        key = CaptureKey(ev.hook, ev.module, ev.type, role, ev.call)
        self.env.captures.add(Capture(key, value, False, dtype_name(items[0].dtype), self._attrs_of(value[0]),
                                      ragged=True, dims=("sample",)))

    def _attrs_of(self, value: torch.Tensor) -> dict:
        """The capture's attributes: no record_dtype on integers or booleans, which are stored as they come."""
        return self.attrs if value.is_floating_point() else {k: v for k, v in self.attrs.items() if k != "record_dtype"}

    def _shape(self, t: torch.Tensor, ev: Event, role: str) -> torch.Tensor:
        """shape(), with a failed select/reduce as one RunError line."""
        try:
            return self.shape(t, ev, role)
        except HookrunError:
            raise
        except (IndexError, RuntimeError, TypeError, ValueError) as exc:  # e.g. a channel that does not exist
            raise RunError(f"{self.where}: record could not select/reduce {role} of {ev.where} "
                           f"(shape {tuple(t.shape)}): {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc

    def shape(self, t: torch.Tensor, ev: Event, role: str) -> torch.Tensor:
        """select -> reduce, on the tensor's device (not yet a copy, not yet cast); neither asked: t, detached."""
        if not self.selections and not self.reduce:
            return t.detach()
        from hookrun.hooks.actions.reduction import select_reduce
        return select_reduce(t, self.selections, self.reduce, self.dims, ev, role, family(role) in self.point.last)
