"""A requested output the module returns as None (issue 34, item 12): GPT-2's attention under sdpa
returns (attn_output, None); `record what: output.1` is one clear error naming what it does return
and, for attention, model.attn_implementation=eager, in the notebook as in a file run. Reference:
the same module called directly returns None there."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from toy_lm import tiny_gpt2

import hookrun
from hookrun.errors import ConfigError

transformers = pytest.importorskip("transformers")
HOOKS = {"a": {"at": "transformer.h.0.attn", "type": "forward", "actions": [{"name": "record", "what": "output.1"}]}}
MESSAGE = (r"hooks\.a\.actions\.0: record what='output\.1': transformer\.h\.0\.attn receives no output\.1: it returns None there.*"
           r"it returns: output\.0; its attention runs attn_implementation=sdpa, .*model\.attn_implementation=eager")


def gpt2(impl: str) -> torch.nn.Module:
    return tiny_gpt2(attn_implementation=impl, n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=50,
                     eos_token_id=2)


def test_the_module_itself_returns_none_for_the_weights_under_sdpa():
    model, seen = gpt2("sdpa"), []
    handle = model.transformer.h[0].attn.register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        model(input_ids=torch.randint(0, 50, (2, 6)))
    handle.remove()
    assert seen[0][1] is None


def test_capture_of_a_none_output_is_one_clear_error_before_the_forward():
    model = gpt2("sdpa")
    with pytest.raises(ConfigError, match=MESSAGE), hookrun.capture(model, HOOKS):
        pass


def test_a_file_run_says_the_same_before_any_batch(tmp_path):
    ds = [{"input_ids": torch.randint(0, 50, (6,))} for _ in range(4)]
    cfg = {"data": {"batch_size": 2, "target": None}, "device": "cpu", "progress": False, "hooks": HOOKS,
           "output": {"path": str(tmp_path / "c.h5")}}
    with pytest.raises(ConfigError, match=MESSAGE):
        hookrun.run(cfg, model=gpt2("sdpa"), dataset=ds)
    assert not list(tmp_path.iterdir())  # no file, no `failed` file


@pytest.mark.parametrize("at", ["transformer.h.*.attn", "**.attn"])
def test_a_glob_reaching_only_such_modules_is_refused_too(at):
    """Before: a glob skipped every module it reached and the capture ended empty, without a word."""
    model = gpt2("sdpa")
    hooks = {"a": {"at": at, "type": "forward", "actions": [{"name": "record", "what": "output.1"}]}}
    with pytest.raises(ConfigError, match=MESSAGE), hookrun.capture(model, hooks):
        pass


def test_eager_attention_records_the_weights():
    model = gpt2("eager")
    ids = torch.randint(0, 50, (2, 6))
    with hookrun.capture(model, HOOKS) as cap, torch.no_grad():
        model(input_ids=ids)
    pattern = cap["transformer.h.0.attn", "output.1"]
    assert pattern.shape == (2, 2, 6, 6)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 2, 6))  # rows of a softmax


def test_rows_token_without_what_on_a_module_with_no_token_tensor_is_one_line_not_an_empty_file(tmp_path):
    """The position embedding's output is (1, tokens, width): not over the batch's tokens. The run
    recorded nothing, said nothing and ended complete; now it names the tensors and what to give.
    (Right-padded prompts: a left-padded batch gives GPT-2 a row of positions per item, runner/calls.py.)"""
    from toy_lm import Prompts

    from hookrun.errors import RunError

    hooks = {"w": {"at": "transformer.wpe", "type": "forward", "actions": [{"name": "record", "rows": "token"}]}}
    with pytest.raises(RunError, match=r"hooks\.w\.actions\.0: rows: token records the tensors over the call's tokens, "
                                       r"and none of transformer\.wpe's is \(batch, tokens, \.\.\.\): input \(1, 7\), "
                                       r"output \(1, 7, \d+\); name one with what:"):
        hookrun.run({"hooks": hooks, "data": {"batch_size": 3}, "progress": False,
                     "output": {"path": str(tmp_path / "t.h5")}}, model=tiny_gpt2(), dataset=Prompts(side="right"))


def test_a_patch_source_of_token_rows_is_named_as_such(tmp_path):
    """A capture recorded with rows: token cannot be patched in; the message said 'one row per step'."""
    from toy_lm import Prompts

    rec = {"r": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    base = {"data": {"batch_size": 3}, "progress": False}
    source = hookrun.run({**base, "hooks": rec, "output": {"path": str(tmp_path / "s.h5")}}, model=tiny_gpt2(), dataset=Prompts()).path
    patch = {"p": {"at": "transformer.h.0", "type": "forward",
                   "actions": [{"name": "modify_output", "op": "patch", "source": str(source)}]}}
    with pytest.raises(ConfigError, match=r"has one row per token \(rows: token\), not one per sample; .*record the source with rows: sample"):
        hookrun.run({**base, "hooks": patch, "output": {"path": str(tmp_path / "p.h5")}}, model=tiny_gpt2(), dataset=Prompts())


def test_a_glob_reaching_only_modules_without_the_role_is_refused_at_the_first_batch(tmp_path):
    """Modules that return one tensor have no output.1: a glob reaching only them skipped them all and the
    run ended 'complete' with nothing recorded (three warnings, exit 0). A glob that reaches one module
    with the role records it. Reference: the modules called directly."""
    from hookrun.errors import RunError

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert all(isinstance(m(torch.ones(1, 4)), torch.Tensor) for m in model)  # one tensor each: no output.1
    ds = [(torch.randn(4), 0) for _ in range(4)]
    hooks = {"r": {"at": "*", "type": "forward", "actions": [{"name": "record", "what": "output.1"}]}}
    cfg = {"data": {"batch_size": 2}, "device": "cpu", "progress": False, "hooks": hooks,
           "output": {"path": str(tmp_path / "c.h5")}}
    with pytest.raises(RunError, match=r"hooks\.r\.actions\.0: every module `at:` reaches is skipped, so nothing would be "
                                       r"recorded; .* receives no output\.1: .* it returns: output$"):
        hookrun.run(cfg, model=model, dataset=ds)
