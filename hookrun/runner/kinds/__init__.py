"""Run kinds: what a batch does (the RunKind interface every kind of run implements, one module or folder
per kind) and the table that picks one for a config.

    from hookrun.runner.kinds import kind_for
    kind_cls = kind_for(cfg)            # EvaluateKind where cfg.evaluate is on, else by cfg.mode
    kind_cls.check(cfg)                 # refusals, before anything is built
    kind = kind_cls(KindContext(cfg, model, loader, spec, points, env, loss, device))
    adds = kind.step(model, call, session)    # the loop, per batch: its forwards, and what they add
    record = StepRecord(..., samples=adds.samples, tables=adds.tables)

| kind        | module           | chosen by                  | forwards per batch                      |
|-------------|------------------|----------------------------|-----------------------------------------|
| record      | __init__.py      | mode=eval                  | 1 (no_grad; early_stop may cut it)      |
| grad        | grad_kind.py     | mode=grad                  | 1 forward + loss + backward             |
| generate    | generate_kind.py | mode=generate              | 1 model.generate (a call per token)     |
| a plugin    | <name>/          | its block (`evaluate:`, `patching:`, `attribution:`, `probe:`, ...) | its own |

A kind with a block of its own is a plugin (hookrun/config/plugins.py): a folder whose __init__.py holds `KIND =
KindPlugin(...)` (its block's dataclass, its RunKind, its reader, its notebook function, its named ops), found on
disk or through an entry point, imported only when a config gives its block (docs/architecture.md walks through one).
A kind plugin is on where its block is given and its RunKind's `wanted(cfg)` says so; two at once are refused in one
line; otherwise the kind whose `mode` is cfg.mode runs (the modes' kinds: `@register_kind("name")` and a line in
SHIPPED below). A kind's notebook function may run its block to a temporary file and read it back (temporary_run.py).

A kind owns what differs between a record, grad or generate run and the block kinds (several forwards per batch, or
steps that are not batches): its forwards, its refusals, what it adds to a step's record and the file, what it
restores on resume; the loop, the session's firing closure and the store never ask which kind runs. RunKind's
members, when each is called and what it does: docs/internals.md's table (What a batch does). A kind of several
forwards per batch hands the session a `Phase` for each (hookrun.hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from hookrun.config import check_config as common_checks
from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, Registry
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
    loader: Any  # the run's DataLoader (runner/loop.py)
    spec: CallSpec
    points: list[HookPoint]
    env: ActionEnv
    loss: Any = None  # the built loss, where the kind needs one (grad, a block kind's ce)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


@dataclass
class StepAdds:
    """What one batch's kind adds to its StepRecord (hookrun.store.records)."""

    samples: dict[str, np.ndarray] | None = None  # per-sample columns for /samples/<name> (generate's generated_ids, ...)
    # the kind's rows by table name ({NAME: row}); the store writes each with the writer its kind registered
    tables: dict[str, Any] = field(default_factory=dict)  # (store/records.py): a new kind's rows need no store change
    generated: bool = False  # the step's token rows include generated tokens (/samples/token_generated)


NOTHING = StepAdds()


class RunKind:
    """The base of every kind: a plain forward per batch under no_grad, nothing added.

    Subclass it, set `name` and `mode` (or `block`), override what differs, and register the
    class with `@register_kind("name")` (a mode's kind) or a KindPlugin (a block's).
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
        The options that may not go together whatever the kind are in hookrun.config's TOGETHER."""

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


KINDS: Registry[type[RunKind]] = Registry("run kind")


def register_kind(name: str) -> Callable[[type[RunKind]], type[RunKind]]:
    """Class decorator: register a RunKind subclass under `name` (its `name` is set to it)."""

    def add(cls: type[RunKind]) -> type[RunKind]:
        if cls.block is None and cls.mode is None:
            raise ValueError(f"run kind {name!r}: give it a mode (the cfg.mode it runs) or a block (the config "
                             f"block that turns it on)")
        taken = [n for n in KINDS.loaded() if n != name and cls.block is None and KINDS.get(n).block is None
                 and KINDS.get(n).mode is cls.mode]
        taken += [n for n, (_, on) in SHIPPED.items() if n != name and n not in KINDS.loaded()
                  and cls.block is None and on is cls.mode]
        if taken:
            raise ValueError(f"run kind {name!r}: mode={cls.mode.value} is run by the kind {taken[0]!r}; "
                             f"a new kind is turned on by a config block of its own (block = ...)")
        cls.name = name
        return KINDS.register(name)(cls)

    return add


def kind_for(cfg: HookrunConfig) -> type[RunKind]:
    """The kind a config runs: the kind plugin its block turns on, else its mode's. A kind's module
    is imported here only where the config gives its block or its mode."""
    for name, (_, on) in SHIPPED.items():
        if on is cfg.mode:
            KINDS.get(name)
    kinds = [KINDS.get(n) for n in KINDS.loaded()]
    on = [k for k in kinds if k.block and k.wanted(cfg)]
    if cfg.blocks:  # a kind plugin's block given (config/plugins.py and user_kind.py: imported only then)
        from hookrun.config.plugins import plugin
        from hookrun.runner.kinds.user_kind import plugin_kind

        on += [k for k in (plugin_kind(plugin(name)) for name in cfg.blocks) if k.wanted(cfg)]
    if len(on) > 1:
        names = " and ".join(k.block for k in on)
        raise ConfigError(f"{names} are each a kind of run of their own and cannot go together; keep one of them")
    if on:
        return on[0]
    for k in kinds:
        if k.block is None and k.mode is cfg.mode:
            return k
    raise ConfigError(f"mode={cfg.mode.value}: no run kind runs it; registered kinds: {', '.join(KINDS)}")


def check_config(cfg: HookrunConfig) -> None:
    """Every refusal before anything is built: the common options' table (config/__init__.py's TOGETHER), then
    the kind's own block (kind.check: evaluate's rows, an object-store output, ...)."""
    kind = kind_for(cfg)
    kind.check_mode(cfg)
    common_checks(cfg)
    kind.check(cfg)
    if cfg.early_stop and kind.block is not None:  # (its forwards read modules or outputs the cut would skip)
        raise ConfigError(f"early_stop=true cuts each forward after the last hook, but the {kind.block} block runs "
                          f"forwards of its own that read modules or outputs past it; drop early_stop")


# the modes' kinds beside the plugins (hookrun/config/plugins.py): name -> (the module that
# registers it, the mode that turns it on), imported when kind_for needs it
SHIPPED: dict[str, tuple[str, Mode]] = {
    "grad": ("hookrun.runner.kinds.grad_kind", Mode.grad),
    "generate": ("hookrun.runner.kinds.generate_kind", Mode.generate),
}
for _name, (_module, _) in SHIPPED.items():
    KINDS.register_lazy(_name, _module)


@register_kind("record")
class RecordKind(RunKind):
    """mode=eval: one forward per batch under no_grad (early_stop may cut it); everything is RunKind's."""

    mode = Mode.eval
