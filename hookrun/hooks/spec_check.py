"""Hook specs checked without a model: what make_plan would refuse first, found from the config alone.

    check_specs(parse_hooks(cfg.hooks))   # ConfigError, one line, at the first action that does not fit

Each hook's type, each action's name, the hook type it fits, its keys and their values' types, a
named op's keys and numbers (and hookrun's own ops that need no hook point, built: noise's std, clamp's
bounds), by the same functions the plan uses on the model (actions.action_params, ops.op_params). A
sweep makes these checks for every job before its first job starts (cli/sweep_checks.py); what needs
the model (a module name, a width, a dim) is checked by each job's plan.
"""

from __future__ import annotations

import inspect
from typing import Any

from hookrun.errors import ConfigError, NotFoundError
from hookrun.hooks import HOOK_TYPES
from hookrun.hooks.actions import action_class, action_params
from hookrun.hooks.ops import OPS, op_params


def check_specs(specs: list[Any]) -> None:
    """Every hook spec's type, actions and their params (see the module doc); ConfigError at the first."""
    for spec in specs:
        try:
            HOOK_TYPES.get(spec.type)
        except NotFoundError as exc:
            raise ConfigError(f"hooks.{spec.name}.type: {exc}") from None
        for action in spec.actions:
            if action.is_target:  # (a user's action class: built on the model)
                continue
            cls = action_class(action, spec.type)
            params = action_params(cls, action)
            named = {p for p in inspect.signature(cls.__init__).parameters if p != "params"}
            if isinstance(params.get("op"), str):  # (a modify action: the keys it does not name are the op's)
                factory, kept, takes_build = op_params(params["op"], {k: v for k, v in params.items() if k not in named},
                                                       action.where)
                if not takes_build and OPS.own(params["op"]):  # hookrun's own, built from numbers alone
                    factory(**kept)
