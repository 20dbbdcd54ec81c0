"""op: splice refuses an SAE at a module other than the one it was trained on (its cfg.json hook_name)
unless other_module: true; with it, the logits equal a raw forward hook on that other module returning
the SAE's reconstruction (test_splice.py's SAE and reference functions)."""

from __future__ import annotations

import pytest
import torch
from test_splice import BLOCK, data, decode, encode, gpt2, run, sae, splice_hooks, stored_logits  # noqa: F401

import hookrun
from hookrun.errors import ConfigError

OTHER = "transformer.h.1"


def at_other(folder, **extra):
    hooks = splice_hooks(folder, **extra)
    hooks["sae"]["at"] = OTHER
    return hooks


def test_an_sae_at_another_module_than_its_own_is_one_line_naming_both(tmp_path, data, sae):  # noqa: F811
    folder, _ = sae
    model = gpt2()
    with pytest.raises(ConfigError) as info:
        run(tmp_path, model, data, at_other(folder))
    msg = str(info.value)
    assert "\n" not in msg and f"trained on {BLOCK}" in msg and f"not {OTHER}" in msg and "other_module: true" in msg
    assert not (tmp_path / "c.h5").exists() and "sae" not in model.transformer.h[1]._modules


def test_other_module_true_splices_it_there(tmp_path, data, sae):  # noqa: F811
    folder, w = sae
    model = gpt2()
    handle = model.transformer.h[1].register_forward_hook(lambda m, a, o: decode(w, encode(w, o)))
    try:
        with torch.no_grad():
            ref = torch.cat([model(input_ids=data.encoded["input_ids"][i:i + 4],
                                   attention_mask=data.encoded["attention_mask"][i:i + 4]).logits
                             for i in range(0, len(data), 4)])
    finally:
        handle.remove()
    with run(tmp_path, model, data, at_other(folder, other_module=True)) as f:
        got = stored_logits(f)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


class Net(torch.nn.Module):
    """Linear -> ReLU -> Linear: the splice at `a`, the output recorded at `b`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_float32_module_spliced_into_a_half_model_reads_its_output_cast_as_an_sae_folder_does(tmp_path, caplog, dtype):
    """A user's float32 `module:` spliced into a bfloat16 or float16 model failed at batch 0 with torch's
    'expected m1 and m2 to have the same dtype' (a failed run file), where an SAE folder in float32 reads
    the model's output cast to its dtype and hands its reconstruction back cast to the model's
    (SparseCoder, Splice). Now the module does the same, said once in the log. Reference: a raw
    forward hook on `a` returning the TiedSAE formula in float32 from the saved tensors, cast back."""
    from safetensors.torch import save_file

    torch.manual_seed(1)
    W, b = torch.randn(8, 16), torch.randn(16)
    save_file({"W": W, "b": b}, str(tmp_path / "w.safetensors"))
    model = Net().to(dtype).eval()
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(2)).to(dtype)
    handle = model.a.register_forward_hook(lambda m, a, o: (torch.relu(o.float() @ W + b) @ W.T).to(o.dtype))
    with torch.no_grad():
        want = model(x)
    handle.remove()
    caplog.set_level("INFO", logger="hookrun")
    module = {"_target_": "test_sae_formats.TiedSAE", "d": 8, "n": 16}
    hooks = {"s": {"at": "a", "type": "forward", "actions": [{"name": "modify_output", "op": "splice", "module": module,
                                                               "state_dict": str(tmp_path / "w.safetensors")}]},
             "r": {"at": "b", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    path = hookrun.run({"data": {"batch_size": 8}, "device": "cpu", "progress": False, "hooks": hooks,
                        "output": {"path": str(tmp_path / "c.h5")}}, model=model,
                       dataset=torch.utils.data.TensorDataset(x, torch.zeros(16))).path
    with hookrun.open_run(path) as run:
        assert run.status == "complete"
        got = torch.from_numpy(run["b", "output"][:].astype("float32"))
    torch.testing.assert_close(got, want.float(), rtol=0, atol=0)
    name = str(dtype).removeprefix("torch.")
    assert (f"hooks.s.actions.0: op splice at a: the module TiedSAE computes in float32 on the model's {name} "
            f"output (cast to float32 on the way in, its reconstruction cast back to {name})") in caplog.messages
