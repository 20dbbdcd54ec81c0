"""The record kind (mode=eval): one forward per batch under no_grad; early_stop may cut it short.

    kind = RecordKind(ctx)
    kind.step(model, call, session)   # the hooks fire; their record actions fill env.captures

Everything is the base's (hookrun.runner.kinds.run_kind.RunKind): it is the plain run.
"""

from __future__ import annotations

from hookrun.config.schema import Mode
from hookrun.runner.kinds import register_kind
from hookrun.runner.kinds.run_kind import RunKind


@register_kind("record")
class RecordKind(RunKind):
    mode = Mode.eval
