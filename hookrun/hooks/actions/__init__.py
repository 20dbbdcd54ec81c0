"""Actions: what runs when a hook fires (record, replace_input, modify_output, modify_grad,
top_examples, logit_lens).
Each module registers its actions by name; base.py holds the Action class and the registry. The
built-in actions are registered by name with their module, imported when a config names them
(ACTIONS.get(name)), so a run that only records loads no lens, SAE or top-examples code.

    from hookrun.hooks.actions import ACTIONS
    ACTIONS.get("logit_lens")   # imports hookrun/hooks/actions/lens.py, which registers the class
"""

from hookrun.hooks.actions.base import ACTIONS, Action, ActionEnv, register_action

# the built-in actions: name -> the module that registers it
for _name, _module in {"record": "record", "replace_input": "modify", "modify_output": "modify",
                       "modify_grad": "modify", "top_examples": "top_examples", "logit_lens": "lens"}.items():
    ACTIONS.register_lazy(_name, f"hookrun.hooks.actions.{_module}")

__all__ = ["ACTIONS", "Action", "ActionEnv", "register_action"]
