"""An action registered again by the same definition (a notebook cell that defines it run a second
time, after an edit) replaces the first: the cell raised "action 'nb_scale' is already registered
(__main__); give it another name" and the old class kept running until the kernel restarted. Another
class under that name is still refused. Reference: the submodule called directly, scaled by numpy."""

from __future__ import annotations

import pytest
import torch

import hookrun
from hookrun.errors import ConfigError
from hookrun.hooks.actions import ACTIONS, Action, register_action

NAME = "nb_scale"


def _cell(factor: float) -> type:
    """The notebook cell: the same class statement, with an edited factor."""

    @register_action(NAME)
    class Scale(Action):
        modifies = True

        def __call__(self, ev):
            ev.replace("output", ev.tensors["output"] * factor)

    return Scale


def test_a_cell_run_again_replaces_its_action_and_another_class_is_refused():
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(3, 4)), torch.randn(2, 3)
    hooks = {"s": {"at": "0", "type": "forward", "actions": [NAME]}}
    try:
        _cell(2.0)
        second = _cell(3.0)  # run again, edited
        assert ACTIONS.get(NAME) is second
        with torch.no_grad(), hookrun.capture(model, hooks):
            y = model(x)
        with torch.no_grad():
            ref = model[0](x).numpy() * 3.0
        assert y.numpy() == pytest.approx(ref, rel=1e-6)

        class Other(Action):
            def __call__(self, ev):
                pass

        with pytest.raises(ConfigError, match=f"action '{NAME}' is already registered .*; give it another name"):
            register_action(NAME)(Other)
        assert ACTIONS.get(NAME) is second
    finally:
        ACTIONS._items.pop(NAME, None)
