"""The module lister: names against named_modules(), shapes and call counts against raw hooks,
keyword inputs, globs as the plan reads them, and the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import ROOT, batches
from torch import nn

import hookrun
from hookrun.errors import ConfigError


class KwargsNet(nn.Module):
    """Its `mix` submodule is called with a keyword input, as transformers' layers are."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.mix = Mix()

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.lin(x)
        return self.mix(h, other=scale)


class Mix(nn.Module):
    def forward(self, h: torch.Tensor, other: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return h * other[:, :1], h.sum(1)


def test_names_types_and_params_are_those_of_named_modules(reference_model):
    table = hookrun.modules(reference_model)
    assert table.names() == [n for n, _ in reference_model.named_modules()]
    named = dict(reference_model.named_modules())
    for m in table:
        assert m.type == type(named[m.name]).__name__
        assert m.params == sum(p.numel() for p in named[m.name].parameters())
        assert m.calls is None  # no example: no forward


def test_shapes_and_calls_equal_raw_hooks(reference_model, dataset):
    x, _ = next(batches(dataset))
    seen: dict[str, list] = {}
    handles = [mod.register_forward_hook(lambda m, a, out, n=n: seen.setdefault(n, []).append((a[0].shape, out.shape)))
               for n, mod in reference_model.named_modules()]
    with torch.no_grad():
        reference_model(x)
    for h in handles:
        h.remove()
    table = hookrun.modules(reference_model, x)
    for m in table:
        assert m.calls == len(seen[m.name]), m.name
        assert m.inputs["input"] == tuple(seen[m.name][0][0]) and m.outputs["output"] == tuple(seen[m.name][0][1])
    assert {m.name: m.calls for m in table}["layer1.0.relu"] == 2  # a BasicBlock calls its ReLU twice
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in reference_model.modules())
    assert "layer1.0.relu" in str(table) and "[4, 64, 8, 8]" in str(table)


def test_keyword_inputs_and_tuple_outputs_are_listed():
    model = KwargsNet()
    table = {m.name: m for m in hookrun.modules(model, {"x": torch.ones(2, 4), "scale": torch.ones(2, 5)})}
    assert table[""].inputs == {"x": (2, 4), "scale": (2, 5)}
    assert table["mix"].inputs == {"input": (2, 3), "other": (2, 5)}
    assert table["mix"].outputs == {"output.0": (2, 3), "output.1": (2,)}
    assert "other=[2, 5]" in str(hookrun.modules(model, {"x": torch.ones(2, 4), "scale": torch.ones(2, 5)}, match="mix"))


def test_match_selects_what_the_plan_would(reference_model):
    assert hookrun.modules(reference_model, match="layer1.*").names() == ["layer1.0", "layer1.1"]
    names = hookrun.modules(reference_model, match="layer1.**").names()
    assert names == [n for n, _ in reference_model.named_modules() if n.startswith("layer1.")]
    with pytest.raises(ConfigError, match="closest names: layer1.0.conv1"):
        hookrun.modules(reference_model, match="layer1.0.cnv1")
    with pytest.raises(ConfigError, match="matches no module"):
        hookrun.modules(reference_model, match="block*")


def test_the_function_is_a_plain_function_beside_its_command():
    # issue 19.5: hookrun.modules is a function (no module swapping its __class__); the command is
    # `python -m hookrun.modules` (test_the_command_line_lists_a_config_model)
    import inspect

    from hookrun.hooks.lister import list_modules

    assert inspect.isfunction(hookrun.modules) and hookrun.modules is list_modules
    assert inspect.isfunction(hookrun.capture)


@pytest.mark.slow
def test_the_command_line_lists_a_config_model(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hookrun.modules", "model=resnet18", "--match", "layer1.**"],
                          cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["module", "type", "params", "calls", "input", "output"]
    assert lines[2].split()[:4] == ["layer1.0", "BasicBlock", "73,984", "1"] and "[1, 64, 56, 56]" in lines[2]
    assert "12 module(s)" in lines[-1]
    bad = subprocess.run([sys.executable, "-m", "hookrun.modules", "model=resnt18"], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert bad.returncode == 2 and bad.stderr.startswith("hookrun: error: model=resnt18: there is no model option")
