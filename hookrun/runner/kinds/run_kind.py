"""What a batch does: the RunKind interface every kind of run implements.

    kind = kind_for(cfg)(KindContext(cfg, model, loader, spec, points, env, loss, device))
    adds = kind.step(model, call, session)    # the loop, per batch: its forwards, and what they add
    record = StepRecord(..., samples=adds.samples, tables=adds.tables)

A kind owns everything that differs between a plain record run, a grad run, a generate run and the
block kinds (several forwards per batch, or steps that are not batches; their folders under kinds/): how many forwards a batch costs, which options it refuses, what it adds to a
step's record and to the file, and what it restores on resume. The loop, the session's firing
closure and the store never ask which kind runs; they read what the kind hands them.

| member                   | when                    | what                                              |
|--------------------------|-------------------------|---------------------------------------------------|
| `name`, `mode`, `block`  | registration            | `mode`: the `cfg.mode` it runs for (record, grad, |
|                          |                         | generate); `block`: the config block that turns   |
|                          |                         | it on (the block kinds): kind_for(cfg)            |
| `forwards`               | estimates, docs         | model forwards (or generate calls) per batch      |
| `adds`                   | end report, warnings    | HDF5 paths it writes beside /captures             |
| `check_mode(cfg)`        | prepare(), first        | cfg.mode refused (a user's kind: all but eval,    |
|                          |                         | unless it has its own: user_kind.py)              |
| `check(cfg)`             | prepare(), before build | refusals: one ConfigError line, before any batch  |
| `inputs_refused(...)`    | prepare(): data, forward| the line for items that do not fit the model      |
| `__init__(ctx)`          | prepare()               | build, with every check that needs the model      |
| `step(model, call, s)`   | every batch             | its forwards under the session -> StepAdds        |
| `sample_step(m, c, s)`   | dry_run estimate        | one sample's step, leaving no state behind        |
| `sample_forward(m, c)`   | prepare(): site check   | one sample through the model, no_grad             |
| `probe(model, call)`     | early_stop's probe      | a forward the session may cut short               |
| `share(rank, world)`     | many ranks, prepare()   | a kind whose rows are not batches takes its share |
|                          |                         | (a grid's cells); None: the ranks split batches   |
| `join_ranks(link)`       | many ranks, prepare()   | a kind that merges the ranks' statistics at the   |
|                          |                         | end gets the channel (output/rank_link.py)        |
| `restore(resume, kept)`  | resume                  | state carried over from the kept batches          |
| `hands_over`, `rejoin()` | many ranks, resume of a | a kind that hands its rows to rank 0 (True) takes |
|                          | complete shard (rank>0) | them from its kept batches and hands them again   |
| `end_note()`             | the run's last log line | what it adds after the file's name ("" for none)  |
| `end_attrs()`            | after its last step     | root attributes known only then ({} for none)     |
| `file_bytes(n)`          | dry_run estimate        | bytes it adds besides the captures                |
| `plan_lines(n)`          | dry_run printout        | its own lines: points, rows, memory               |
| `estimated`              | dry_run, max_bytes      | False: its rows (cells, steps) are not estimated, |
|                          |                         | so output.max_bytes is refused                    |

A kind that runs several forwards per batch hands the session a `Phase` for each
(`with session.phase(CLEAN): ...`, hookrun.hooks): a phase is a value saying whether every
action runs (`every`), or only the modifying ones (`modifying`), and whether those return the
ablation instead of their op (`ablate`); the firing closure reads these flags and nothing else.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.hooks import StopForward
from hookrun.store import BATCH_UNITS

if TYPE_CHECKING:
    from hookrun.hooks import HookPoint
    from hookrun.hooks.actions import ActionEnv
    from hookrun.hooks.session import HookSession
    from hookrun.runner.calls import CallSpec, ModelCall


@dataclass
class KindContext:
    """What prepare() has built when the kind is made: everything a kind's checks and steps use."""

    cfg: HookrunConfig
    model: nn.Module
    loader: Any  # the run's DataLoader (runner/batches.py)
    spec: CallSpec
    points: list[HookPoint]
    env: ActionEnv
    loss: Any = None  # the built loss, where the kind needs one (grad, a block kind's ce)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


@dataclass
class StepAdds:
    """What one batch's kind adds to its StepRecord (hookrun.store.records).

    samples: per-sample columns for /samples/<name> (generate's generated_ids, ...).
    tables: the kind's rows by table name ({NAME: row}); the store writes each with
        the writer its kind registered (store/records.py): a new kind's rows need no store change.
    generated: the step's token rows include generated tokens (/samples/token_generated).
    """

    samples: dict[str, np.ndarray] | None = None
    tables: dict[str, Any] = field(default_factory=dict)
    generated: bool = False


NOTHING = StepAdds()


class RunKind:
    """The base of every kind: a plain forward per batch under no_grad, nothing added.

    Subclass it, set `name` and `mode` (or `block`), override what differs, and register the
    class with `@KINDS.register("name")` (hookrun.runner.kinds).
    """

    name: ClassVar[str] = ""
    mode: ClassVar[Mode | None] = None  # the cfg.mode this kind runs, where no block kind is on
    block: ClassVar[str | None] = None  # a config block (cfg.<block>) that turns this kind on
    estimated: ClassVar[bool] = True  # its rows are in the dry-run estimate (patching's cells, sae's steps are not)
    forwards: ClassVar[int] = 1  # model forwards (or generate calls) per batch
    adds: ClassVar[tuple[str, ...]] = ()  # HDF5 paths this kind writes beside /captures (its tables' groups)
    uses_loss: ClassVar[bool] = False  # prepare() builds cfg.loss for it (grad, a block kind's ce)
    units: ClassVar[tuple[str, str]] = BATCH_UNITS  # what the log calls its steps and its rows
    hands_over: ClassVar[bool] = False  # many ranks: ranks 1..N-1 hand their rows to rank 0 (join_ranks' link)

    def __init__(self, ctx: KindContext) -> None:
        self.ctx = ctx
        self.check_actions()

    def check_actions(self) -> None:
        """Every action says whether it can run in this kind's mode (record without rows: token in
        generate, a `positions:` outside generate ...): the first that cannot is one ConfigError."""
        mode = self.ctx.cfg.mode
        for p in self.ctx.points:
            for a in p.actions:
                a.check_mode(mode)

    @classmethod
    def wanted(cls, cfg: HookrunConfig) -> bool:
        """Whether cfg turns this block kind on (its block given and not `enabled: false`)."""
        node = getattr(cfg, cls.block, None) if cls.block else None
        return node is not None and getattr(node, "enabled", True) is not False

    @classmethod
    def check(cls, cfg: HookrunConfig) -> None:
        """Refuse what this kind cannot run (one ConfigError line), before anything is built.
        The options that may not go together whatever the kind are in hookrun.config.schema's TOGETHER."""

    @classmethod
    def check_mode(cls, cfg: HookrunConfig) -> None:
        """Refuse cfg.mode where the kind makes its own forwards: run before the common table, whose
        rows about a mode (mode=grad needs a loss, ...) do not apply to such a kind."""

    @classmethod
    def call_inputs(cls, cfg: HookrunConfig) -> tuple[Any, Any]:
        """(data.inputs, data.target) as the run's forward takes them: the config's, unless the kind
        has its own default (a kind whose items name their own input key)."""
        return cfg.data.inputs, cfg.data.target

    @classmethod
    def inputs_refused(cls, cfg: HookrunConfig, model: nn.Module, refusal: Exception) -> Exception:
        """The error prepare() raises where the items cannot be built or do not fit the model's
        forward (`refusal`, one ConfigError line): a kind whose items and model must be of one
        sort (patching's token ids into a language model) says what it needs instead."""
        return refusal

    def step(self, model: nn.Module, call: ModelCall, session: HookSession) -> StepAdds:
        """One batch: its forwards under `session`, and what they add to the step's record."""
        plain_forward(model, call)
        return NOTHING

    def sample_step(self, model: nn.Module, call: ModelCall, session: HookSession) -> StepAdds:
        """The dry-run estimate's step of one sample: as `step`, leaving no state behind."""
        return self.step(model, call, session)

    def sample_forward(self, model: nn.Module, call: ModelCall) -> None:
        """One sample through the model with nothing of the run hooked (the site check listens)."""
        with torch.no_grad():
            call.run(model)

    def probe(self, model: nn.Module, call: ModelCall) -> None:
        """early_stop's probe: one forward the session may cut short."""
        plain_forward(model, call)

    def share(self, rank: int, world: int) -> str | None:
        """Many ranks (output/shards.py), before prepare_run: a kind whose steps are not batches of the
        data takes rank `rank` of `world`'s share of its own rows and returns a label for it; None
        (every kind whose steps are batches): the ranks split the batches (output/shards.py)."""
        return None

    def join_ranks(self, link: Any) -> None:
        """Many ranks, after share(): `link` (output/rank_link.py's RankLink, None in tests that narrow a
        run by hand) lets a kind whose result needs every rank's rows hand them to rank 0."""

    def prepare_run(self, p: Any) -> None:
        """After prepare (runner/prepare.py's Prepared `p`), before the store opens: what a kind sets
        up beyond the loop (its base runs, every check, its layout in `p.attrs`)."""

    def run_steps(self, data_loop: Callable[[], int], writer: Any, first_row: int,
                  should_stop: Callable[[], bool]) -> int:
        """The run's steps, written to `writer`: the data loop (`data_loop()`, one step a batch) for
        every kind whose steps are batches of the data; a kind whose steps are something else
        (chunks of a grid's cells, rows from `first_row` on) writes its own. Returns the steps run.
        End-of-run arrays are written here after the loop (`writer.drain()`, then
        `writer.store.write_features`, as the similarity kind does)."""
        return data_loop()

    def close(self) -> None:
        """After the run, also when it failed: release what prepare_run took."""

    def restore(self, resume: Any, kept: int) -> None:
        """A resumed run: carry over this kind's state from the `kept` batches of the old run
        (`resume`: what output/resume.py opened; a local file's is `resume.file`, an h5py.File)."""

    def replay(self, begin: int, kept: int, points: list, each: Callable[[Any, ModelCall], None]) -> None:
        """A resumed run's kept batches [begin, begin + kept), each handed to `each(indices, call)` inside the
        forward their step had: the user's hooks (`points`) attached, the batch's step and items set, their
        modifying actions run (REPLAY); records and top_examples do not run again (the file keeps theirs)."""
        from hookrun.hooks import REPLAY
        from hookrun.hooks.session import HookSession

        with HookSession(points, self.ctx.env) as session:
            for step, (indices, batch) in enumerate(itertools.islice(self.ctx.loader, begin + kept)):  # (no batch after)
                if step >= begin:
                    call = self.ctx.spec.split(batch).to(self.ctx.device)
                    session.begin_step(step, len(indices), indices, call.attention_mask, call.batch)
                    with session.phase(REPLAY):
                        each(indices, call)

    def rejoin(self, resume: Any, kept: int) -> None:
        """Many ranks, resumed, a rank but 0 whose shard is complete (`kept` batches), of a kind that
        `hands_over`: rebuild its part from those batches and hand it to rank 0 again, where rank 0 still
        gathers (runner/__init__.py calls this after prepare_run instead of the loop; the shard is not written)."""

    def end_attrs(self) -> dict[str, Any]:
        """Root attributes known only once the steps have run (an edges grid written as it goes: its node scores
        and faithfulness); written after the last step, not when the steps stopped early."""
        return {}

    def end_note(self) -> str:
        """What the run's last log line adds after the file's name (an edges run: its recovered fractions)."""
        return ""

    def file_bytes(self, n_samples: int) -> int:
        """Bytes this kind adds to the file besides the captures (the dry-run estimate)."""
        return 0

    def plan_lines(self, n_samples: int) -> list[str]:  # dry_run: its own work (points, rows, memory), under the hooks'
        return []

    def token_rows(self, call: ModelCall) -> int:
        """Token rows per sample where the kind makes more than the batch holds (generate); 0: as the batch."""
        return 0


def plain_forward(model: nn.Module, call: ModelCall) -> Any:
    """A forward under no_grad that early_stop may cut short (its StopForward ends it quietly)."""
    try:
        with torch.no_grad():
            return call.run(model)
    except StopForward:
        return None


def own_copy(call: ModelCall) -> ModelCall:
    """The call with its own copy of every input tensor (nested ones too; one tensor passed twice stays one):
    a forward may change its inputs in place (x.clamp_(), x += ...), and a kind's next forward of the
    batch (evaluate's, similarity's `with:` model's) must see the batch as it came."""
    memo: dict[int, torch.Tensor] = {}

    def copy(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return memo.setdefault(id(obj), obj.clone())
        if isinstance(obj, Mapping):
            return {k: copy(v) for k, v in obj.items()}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(copy(v) for v in obj))
        return type(obj)(copy(v) for v in obj) if isinstance(obj, tuple | list) else obj

    return replace(call, args=copy(call.args), kwargs=copy(call.kwargs), attention_mask=copy(call.attention_mask))
