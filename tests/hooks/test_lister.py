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


def test_a_train_mode_model_comes_back_as_it_was():
    """BatchNorm's running statistics and every module's training flag (one set apart) are those
    from before the listing; its shapes are a raw forward hook's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.Flatten(), nn.Linear(64, 2)).train()
    model[2].eval()
    x = torch.randn(5, 3, 6, 6)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [m.training for m in model.modules()]
    seen = []
    handle = model[1].register_forward_hook(lambda m, a, out: seen.append((a[0].shape, out.shape)))
    with torch.no_grad():
        model(x)
    handle.remove()
    before_raw = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(before)
    table = hookrun.modules(model, x)
    after = model.state_dict()
    assert any(not torch.equal(before[k], before_raw[k]) for k in before)  # a train-mode forward does change them
    assert all(torch.equal(before[k], after[k]) for k in before), [k for k in before if not torch.equal(before[k], after[k])]
    assert [m.training for m in model.modules()] == flags
    info = {m.name: m for m in table}["1"]
    assert info.inputs["input"] == tuple(seen[0][0]) and info.outputs["output"] == tuple(seen[0][1])


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

    from hookrun.notebook.lister import list_modules

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


# -- op sites (issue 21) ----------------------------------------------------------------------------
SITE_FNS = ("softmax", "add", "add_", "matmul", "flatten", "layer_norm", "mul", "silu")


def resnet_and_images():
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval(), torch.randn(2, 3, 32, 32)


def model_and_example(which: str):
    import op_models

    if which == "resnet":
        model, x = resnet_and_images()
        return model, x, lambda: model(x)
    model, batch = getattr(op_models, which)(), op_models.padded_batch()
    return model, batch, lambda: model(**batch)


@pytest.mark.parametrize("which", ["gpt2", "llama", "resnet"])
def test_op_sites_are_listed_under_their_module_in_call_order_and_work_as_at(which):
    pytest.importorskip("transformers")
    from op_models import OwnCalls

    model, example, forward = model_and_example(which)
    table = hookrun.modules(model, example, ops=True)
    with torch.no_grad(), OwnCalls(model) as ref:  # the test's own interception (tests/helpers/op_models.py)
        forward()
    want = ref.first
    ops = table.ops()
    assert ops and all(m.op for m in ops)
    current = None
    for m in table:  # each op row follows its module's row
        if m.op is None:
            current = m.name
        else:
            assert m.name.rsplit("/", 1)[0] == current, m.name
    for op in ops:  # a call of that module's own code, with the shape the forward gave it
        assert op.name in want, op.name
        if isinstance(want[op.name], torch.Tensor):
            assert op.outputs["output"] == tuple(want[op.name].shape), op.name
    def fn_of(name):
        return name.split("/")[-1].rsplit(".", 1)[0]

    listed = [o.name for o in ops]
    for module in {n.rsplit("/", 1)[0] for n in want}:  # under each module, in call order; these FNs' every call
        own = [n for n in want if n.rsplit("/", 1)[0] == module]
        assert [n for n in listed if n.rsplit("/", 1)[0] == module] == [n for n in own if n in listed], module
        assert {n for n in own if fn_of(n) in SITE_FNS} <= set(listed), module
    batch_size = 2 if which == "resnet" else 3
    chosen = [o.name for o in ops if fn_of(o.name) in SITE_FNS
              and o.outputs.get("output", ())[:1] == (batch_size,)]
    hooks = {"o": {"at": chosen, "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        forward()
    assert len(chosen) >= {"gpt2": 12, "llama": 20, "resnet": 9}[which]
    for name in chosen:
        torch.testing.assert_close(cap[name, "output"], want[name], msg=name)
    names = set(table.names())
    expected = {"gpt2": ["transformer.h.0.attn/softmax.0", "transformer.h.1/add.1"],
                "llama": ["model.layers.0.self_attn/softmax.0", "model.layers.1/add.0"],
                "resnet": ["/flatten.0", "layer1.0/add_.0", "layer4.1/add_.0"]}[which]
    assert set(expected) <= names and set(expected) <= set(chosen)
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in model.modules())


def test_match_names_op_sites_and_errors_name_what_the_module_calls():
    model, x = resnet_and_images()
    table = hookrun.modules(model, x, match="layer*.0/add_")
    assert table.names() == [f"layer{i}.0/add_.0" for i in range(1, 5)]
    assert table[0].inputs == {"input.0": (2, 64, 8, 8), "input.1": (2, 64, 8, 8)} and table[0].op == "Tensor.add_"
    assert str(table).splitlines()[2].split()[:4] == ["layer1.0/add_.0", "Tensor.add_", "-", "1"]
    assert hookrun.modules(model, x, match="/flatten").names() == ["/flatten.0"]
    with pytest.raises(ConfigError, match=r"names no op site .* their own forwards call: add_"):
        hookrun.modules(model, x, match="layer1.0/softmax")
    with pytest.raises(ConfigError, match="give an example input"):
        hookrun.modules(model, ops=True)


@pytest.mark.slow
def test_the_command_line_lists_gpt2_attention_sites(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "PATH": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "hookrun.modules", "model=hf", "data=text", "--ops", "--match",
                           "transformer.h.0.attn"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[2:-1]}
    assert rows["transformer.h.0.attn"][1] == "GPT2Attention"
    assert rows["transformer.h.0.attn/softmax.0"][1:4] == ["F.softmax", "-", "1"]
    assert "[1, 4, 32, 32]" in " ".join(rows["transformer.h.0.attn/softmax.0"])  # data=text: 32 tokens; 4 heads
    assert list(rows).index("transformer.h.0.attn/matmul.0") < list(rows).index("transformer.h.0.attn/softmax.0")
    assert proc.stdout.splitlines()[-1].startswith("1 module(s), ")
    bad = subprocess.run([sys.executable, "-m", "hookrun.modules", "model=resnet18", "--ops", "--no-example"], cwd=tmp_path,
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "--ops needs the example's forward" in bad.stderr


def test_a_shipped_model_is_listed_with_its_own_data(capsys):
    """`python -m hookrun.modules model=tiny_cnn` fed the default data's 3 x 224 x 224 image to a
    1-channel model and failed; now its own data (data=shapes) gives the example, said in one line,
    and a mismatched data set is one line naming the options (the shapes: a raw forward hook)."""
    from hookrun.cli.modules_command import modules_of_config
    from hookrun.data import shapes
    from hookrun.models import tiny_cnn

    table = {m.name: m for m in modules_of_config(["model=tiny_cnn", "device=cpu"])}
    assert "example: data=shapes" in capsys.readouterr().out
    model, seen = tiny_cnn().eval(), {}
    for name, module in model.named_modules():
        module.register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, (list(i[0].shape), list(o.shape))) and None)
    model(shapes(size=1)[0][0][None])
    for name in ("block1.0", "fc"):
        assert [list(v) for v in table[name].inputs.values()][0] == seen[name][0], (name, table[name].inputs)
    with pytest.raises(ConfigError) as err:
        modules_of_config(["model=tiny_cnn", "data=synthetic", "device=cpu"])
    line = str(err.value)
    assert "\n" not in line and "[1, 3, 224, 224]" in line and "data=shapes" in line and "--no-example" in line
