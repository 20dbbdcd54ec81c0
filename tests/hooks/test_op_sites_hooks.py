"""Op sites next to module hooks: the torch calls a hook's own actions make (an op's `x + v`, a
record's copy) are no module's code. A child's forward hook runs after the child has returned, so
its calls were counted as the parent's: `transformer.h.1/add.0` recorded the steered attention
output instead of the residual midpoint, and a third `add.2` appeared. References: raw torch
module hooks on the same weights, and the tests' own TorchFunctionMode (op_models.OwnCalls)."""

from __future__ import annotations

import h5py
import numpy as np
import op_models
import pytest
import torch
from warm_python import python as warm

import hookrun

pytest.importorskip("transformers")


def test_a_steered_childs_hook_does_not_shift_the_parents_add_sites(tmp_path):
    model, batch = op_models.gpt2(), op_models.padded_batch()
    block, seen = model.transformer.h[1], {}
    handles = [block.register_forward_pre_hook(lambda m, a, kw: seen.update({"in": a[0] if a else kw["hidden_states"]}),
                                               with_kwargs=True),
               block.attn.register_forward_hook(lambda m, i, o: (o[0] + 1.0, *o[1:])),  # the steer, by hand
               block.attn.register_forward_hook(lambda m, i, o: seen.update({"attn": o[0]})),
               block.register_forward_hook(lambda m, i, o: seen.update({"out": o[0] if isinstance(o, tuple) else o}))]
    with torch.no_grad():
        model(**batch)
    for h in handles:
        h.remove()
    hooks = {"steer": {"at": "transformer.h.1.attn", "type": "forward",
                       "actions": [{"name": "modify_output", "op": "add", "value": 1.0, "arg": 0}]},
             "mid": {"at": "transformer.h.1/add", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    data = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]
    path = hookrun.run({"hooks": hooks, "data": {"batch_size": 3}, "device": "cpu", "progress": False,
                        "output": {"path": str(tmp_path / "c.h5")}}, model=model, dataset=data).path
    with h5py.File(path) as f:
        assert sorted(f["captures/mid"]) == ["transformer.h.1%2Fadd.0", "transformer.h.1%2Fadd.1"]  # the block's two
        np.testing.assert_allclose(f["captures/mid/transformer.h.1%2Fadd.0/output"][:], (seen["in"] + seen["attn"]).numpy(),
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(f["captures/mid/transformer.h.1%2Fadd.1/output"][:], seen["out"].numpy(), rtol=1e-6, atol=1e-6)


def test_a_pre_hooks_op_on_the_site_module_fires_no_site():
    model, batch = op_models.gpt2(), op_models.padded_batch()
    with torch.no_grad(), op_models.OwnCalls(model) as ref:
        model(**batch)
    assert not any(name.startswith("transformer.h.0/mul") for name, _ in ref.calls)  # GPT2Block's code multiplies nothing
    handle = model.transformer.h[0].register_forward_pre_hook(lambda m, a: (a[0] * 2.0, *a[1:]))
    with torch.no_grad():
        want = model(**batch).logits
    handle.remove()
    hooks = {"x2": {"at": "transformer.h.0", "type": "forward_pre",
                    "actions": [{"name": "replace_input", "op": "scale", "factor": 2.0, "arg": 0}]},
             "m": {"at": "transformer.h.0/mul", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "a": {"at": "transformer.h.0/add", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        got = model(**batch).logits
    torch.testing.assert_close(got, want)
    assert sorted(module for _, module, _ in cap.keys()) == ["transformer.h.0/add.0", "transformer.h.0/add.1"]


def test_a_globs_call_index_past_the_calls_names_the_calls_it_does_make(tmp_path):
    """It said 'softmax is called by none of the 2 modules a glob reaches', then listed softmax among
    transformer.h.0.attn's calls. Reference: each GPT-2 attention module calls softmax once (OwnCalls)."""

    model = op_models.gpt2()
    with torch.no_grad(), op_models.OwnCalls(model) as ref:
        model(**op_models.padded_batch())
    assert [n for n, _ in ref.calls if "/softmax" in n] == ["transformer.h.0.attn/softmax.0", "transformer.h.1.attn/softmax.0"]
    done = warm(["-m", "hookrun", "experiment=gpt2_attention", "data.limit=1", "data.batch_size=1",
                 "data.dataset.max_length=16", "progress=false", "hooks.attn.at=transformer.h.*.attn/softmax.3",
                 f"hydra.run.dir={tmp_path / 'run'}"], timeout=600)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "hookrun: error: hooks.attn.at: softmax.3 runs at none of the 2 modules a glob reaches (transformer.h.0.attn, "
        "transformer.h.1.attn): transformer.h.0.attn calls softmax 1 time(s) per forward (softmax.0 to softmax.0); "
        "`transformer.h.0.attn/softmax` takes every call")
    assert not (tmp_path / "run" / "captures.h5").exists()


def test_a_gradient_site_in_a_module_called_twice_keeps_each_calls_gradient():
    """A BasicBlock calls its ReLU twice; backward reaches the second call first, and the gradients were
    numbered by arrival: `grad` held the second call's, `grad@1` the first's. Reference: autograd.grad
    at each call's output, kept by a raw forward hook on the same ReLU."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    outs = []
    handle = model.layer1[0].relu.register_forward_hook(lambda m, i, o: outs.append(o))
    want = torch.autograd.grad(model(x).logsumexp(-1).sum(), outs)
    handle.remove()
    assert len(want) == 2 and not torch.allclose(want[0], want[1])
    with hookrun.capture(model, {"g": {"at": "layer1.0.relu/relu", "type": "tensor", "actions": ["record"]}}) as cap:
        model(x).logsumexp(-1).sum().backward()
    torch.testing.assert_close(cap["layer1.0.relu/relu.0", "grad"], want[0])
    torch.testing.assert_close(cap["layer1.0.relu/relu.0", "grad@1"], want[1])
