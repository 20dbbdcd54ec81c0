"""Resolving hook points: names, globs, close-match errors; and hooks removed after the session."""

from __future__ import annotations

import pytest
import torch
from conftest import small_resnet

from hookrun.config import parse_hooks
from hookrun.errors import ConfigError, NotFoundError
from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.plan import make_plan, resolve_targets
from hookrun.hooks.session import HookSession


def names(model, *patterns, kind="module"):
    return [n for n, _ in resolve_targets(model, patterns, "h", kind)]


def test_exact_names_and_whole_model():
    m = small_resnet()
    assert names(m, "layer1.0.conv1") == ["layer1.0.conv1"]
    assert names(m, "") == [""]


def test_glob_star_stays_within_one_component():
    m = small_resnet()
    assert names(m, "layer1.*") == ["layer1.0", "layer1.1"]
    assert names(m, "layer*.0.conv?") == [f"layer{i}.0.conv{j}" for i in range(1, 5) for j in (1, 2)]
    expected = [n for n, _ in m.named_modules() if n.rpartition(".")[2] == "relu"]
    assert names(m, "**.relu") == expected and len(expected) == 9 and expected[0] == "relu"  # (the stem's too)
    assert names(m, "layer1.**.relu") == ["layer1.0.relu", "layer1.1.relu"]
    assert names(m, "layer1.**") == [n for n, _ in m.named_modules() if n.startswith("layer1.")]
    top = [n for n, _ in m.named_children()]
    assert names(m, "*") == top and names(m, "**")[0] == top[0]  # a glob never names the whole model ('')


def test_list_of_patterns_is_in_model_order_without_repeats():
    m = small_resnet()
    assert names(m, "fc", "conv1", "conv*") == ["conv1", "fc"]


def test_parameter_names_and_globs():
    m = small_resnet()
    assert names(m, "fc.*", kind="param") == ["fc.weight", "fc.bias"]


def test_unknown_module_lists_closest_names():
    with pytest.raises(NotFoundError, match=r"no module 'layer1.0.conv3'.*closest names: layer1\.0\.conv2, layer1\.0\.conv1"):
        names(small_resnet(), "layer1.0.conv3")


def test_pattern_matching_nothing_is_an_error():
    with pytest.raises(ConfigError, match=r"pattern 'block\*' matches no module of ResNet; top-level modules: conv1"):
        names(small_resnet(), "block*")


def test_unknown_hook_type_and_action_list_the_known_ones():
    m = small_resnet()
    with pytest.raises(ConfigError, match=r"hooks.h.type: unknown hook type 'fwd'.*forward, forward_pre"):
        make_plan(m, parse_hooks({"h": {"at": "fc", "type": "fwd"}}), ActionEnv(), "eval")
    with pytest.raises(ConfigError, match=r"hooks.h.actions.0: unknown action 'recrod'; did you mean: record"):
        make_plan(m, parse_hooks({"h": {"at": "fc", "type": "forward", "actions": ["recrod"]}}), ActionEnv(), "eval")


def test_gradient_hooks_need_grad_mode():
    with pytest.raises(ConfigError, match="only with mode=grad"):
        make_plan(small_resnet(), parse_hooks({"h": {"at": "fc", "type": "backward"}}), ActionEnv(), "eval")


def test_record_what_must_be_a_role_the_hook_sees():
    with pytest.raises(ConfigError, match=r"what='grad' is not something a forward hook sees; choose from: input, output"):
        make_plan(small_resnet(), parse_hooks({"h": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "grad"}]}}), ActionEnv(), "eval")


def test_unknown_action_parameter():
    with pytest.raises(ConfigError, match=r"record has no parameter 'wat'; its parameters: what"):
        make_plan(small_resnet(), parse_hooks({"h": {"at": "fc", "type": "forward", "actions": [{"name": "record", "wat": "x"}]}}), ActionEnv(), "eval")


@pytest.mark.parametrize("hooks, message", [
    ({"h": {"type": "forward"}}, "hooks.h.at is missing"),
    ({"h": {"at": "fc", "typ": "forward"}}, "unknown key typ"),
    ({"h": {"at": 3, "type": "forward"}}, "hooks.h.at: expected a module path"),
    ({"h": {"at": "fc", "type": "forward", "actions": None}}, "expected a list of actions"),
    ({"h": {"at": "fc", "type": "forward", "actions": [{"what": "output"}]}}, "needs `name: ACTION`"),
    (["fc"], "expected a mapping"),
])
def test_bad_hook_specs(hooks, message):
    with pytest.raises(ConfigError, match=message):
        parse_hooks(hooks)


def all_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(m._backward_pre_hooks) for m in model.modules()) + sum(
        len(p._backward_hooks or {}) for p in model.parameters())


def test_every_hook_is_removed_after_the_session_even_on_error():
    model = small_resnet()
    specs = parse_hooks({t: {"at": "layer1.*" if t != "param" else "fc.weight", "type": t}
                         for t in ("forward_pre", "forward", "backward_pre", "backward", "tensor", "param")})
    env = ActionEnv()
    points = make_plan(model, specs, env, "grad")
    with pytest.raises(RuntimeError, match="boom"):
        with HookSession(points, env) as session:
            assert all_hooks(model) > 0
            session.begin_step(0, 2, torch.arange(2))
            model(torch.randn(2, 3, 32, 32, requires_grad=True)).sum().backward()
            raise RuntimeError("boom")
    assert all_hooks(model) == 0


@pytest.mark.parametrize("action", [
    "recrod",                                                    # no such action
    {"name": "record", "wat": "x"},                              # a key the action does not take
    {"name": "record", "what": "output"},                        # (a spec the plan takes: passes)
    {"name": "modify_grad", "op": "zero"},                       # an action that does not fit the hook type
    {"name": "modify_output", "op": "scale", "factor": "abc"},   # an op's number that is none
    {"name": "modify_output", "op": "scael", "factor": 0.5},     # no such op
    {"name": "modify_output", "op": "noise", "std": -1},         # an own op's value its factory refuses
    {"name": "modify_output", "op": "clamp"},                    # ... and one without the keys it needs
    {"name": "modify_output", "op": "add", "value": 1, "dimm": 0},  # an op's unknown key
])
def test_the_specs_checked_without_a_model_refuse_what_the_plan_refuses_with_its_line(action):
    """A sweep checks every job's hooks before its first job runs (hooks/spec_check.py): the line is the
    plan's own on a real model, and a spec the plan takes passes. Reference: make_plan on a ResNet."""
    from hookrun.hooks.spec_check import check_specs

    specs = parse_hooks({"h": {"at": "fc", "type": "forward", "actions": [action]}})
    try:
        make_plan(small_resnet(), specs, ActionEnv(), "eval")
        planned = None
    except ConfigError as exc:
        planned = str(exc)
    try:
        check_specs(specs)
        checked = None
    except ConfigError as exc:
        checked = str(exc)
    assert checked == planned and (planned is None) == (action == {"name": "record", "what": "output"})
