"""Actions: what runs when a hook fires (record, replace_input, modify_output, modify_grad,
top_examples, logit_lens).
Each module registers its actions by name; base.py holds the Action class and the registry."""

from hookrun.hooks.actions import lens, modify, record, top_examples  # noqa: F401  (registers the built-in actions)
from hookrun.hooks.actions.base import ACTIONS, Action, ActionEnv, register_action

__all__ = ["ACTIONS", "Action", "ActionEnv", "register_action"]
