"""Everything a run attaches to the user's model has one owner (ModelHold, hooks/actions/__init__.py): after a run that
completes, a run whose third batch fails, and a notebook patch_grid, no hook is left on any
module, no `.sae` child, and the model's flags and weights are as they went in. References: the
model's own hook dicts and children, read here, and a copy of its state_dict taken before."""

from __future__ import annotations

import json

import h5py
import pytest
import torch

import hookrun
from hookrun.data.swaps import word_swap
from hookrun.data.text import text
from hookrun.errors import RunError
from hookrun.hooks.actions import ModelHold

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")
D, D_SAE = 128, 64  # the shipped tiny_lm's width; an SAE of 64 latents


def tiny():
    from hookrun.models import tiny_lm

    return tiny_lm()


def attached(model: torch.nn.Module) -> list[str]:
    """Every hook and spliced child left on the model, by module name."""
    dicts = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")
    left = [f"{n or '(model)'}.{d}" for n, m in model.named_modules() for d in dicts if getattr(m, d, None)]
    return left + [f"{n}.sae" for n, m in model.named_modules() if "sae" in m._modules]


@pytest.fixture(scope="module")
def sae(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sae")
    g = torch.Generator().manual_seed(1)
    w = {"W_enc": torch.randn(D, D_SAE, generator=g) * 0.1, "W_dec": torch.randn(D_SAE, D, generator=g) * 0.1,
         "b_enc": torch.zeros(D_SAE), "b_dec": torch.zeros(D)}
    safetensors.save_file(w, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": D, "d_sae": D_SAE, "dtype": "float32", "apply_b_dec_to_input": True,
        "normalize_activations": "none", "metadata": {"hook_name": "transformer.h.0", "sae_lens_version": "6.0.0"}}))
    return folder


class FailsAt(torch.utils.data.Dataset):
    """The text items, with item `bad` raising: the run fails in the middle of its loop."""

    def __init__(self, items, bad: int | None) -> None:
        self.items, self.bad = items, bad

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"item {i} is unreadable")
        return self.items[i]


@pytest.mark.parametrize("bad", [None, 9], ids=["complete", "fails_in_batch_3"])
def test_a_run_leaves_nothing_attached_and_the_model_as_it_was(tmp_path, sae, bad):
    model = tiny().train()
    model.transformer.h[1].mlp.act.inplace = True  # a flag a grad run would turn off
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()}
    hooks = {  # a splice (a child module), an op site, a lens (its own unembed hook) and plain records
        "sae": {"at": "transformer.h.0", "type": "forward",
                "actions": [{"name": "modify_output", "op": "splice", "path": str(sae)}]},
        "p": {"at": "transformer.h.1.attn/softmax", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
        "lens": {"at": "transformer.h.*", "type": "forward",
                 "actions": [{"name": "logit_lens", "norm": "transformer.ln_f", "unembed": "lm_head", "top_k": 2}]},
        "g": {"at": "transformer.h.1", "type": "tensor", "actions": ["record"]},
    }
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "mode": "grad", "progress": False, "hooks": hooks,
           "loss": {"_target_": "hookrun.runner.losses.lm", "_partial_": True},
           "output": {"path": str(tmp_path / "c.h5")}}
    data = FailsAt(text(files="pydoc_topics", max_length=12, limit=12), bad)
    if bad is None:
        assert hookrun.run(cfg, model=model, dataset=data).status == "complete"
    else:
        with pytest.raises(RunError, match=r"^data: loading batch 2 \(items 8\.\.11\) failed: ValueError: item 9 is unreadable") as err:
            hookrun.run(cfg, model=model, dataset=data)
        assert isinstance(err.value.__cause__, ValueError)  # the data's own error, as it was raised
        with h5py.File(tmp_path / "c.h5") as f:  # the file keeps the two batches before it
            assert (f.attrs["status"], f.attrs["steps_complete"]) == ("failed", 2)
            assert f["samples/index"][:].tolist() == list(range(8))
    assert attached(model) == []
    assert {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()} == modes
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_patch_grid_hands_the_model_back_in_its_mode_with_no_hook(sae):
    model = tiny().train()
    hooks = {"sae": {"at": "transformer.h.0", "type": "forward",
                     "actions": [{"name": "modify_output", "op": "splice", "path": str(sae), "error_term": True}]}}
    grid = hookrun.patch_grid(model, word_swap(n=2, length=12), hooks=hooks, metric={"name": "logit_diff"},
                              sites={"latents": {"at": "transformer.h.0.sae.latents", "over": ["position"]}})["latents"]
    assert torch.isfinite(torch.as_tensor(grid.values)).all()
    assert attached(model) == []
    assert all(m.training for m in model.modules())


def test_a_failing_undo_does_not_stop_the_others():
    done = []
    hold = ModelHold()
    hold.on_close(lambda: done.append("first attached"))
    hold.on_close(lambda: (_ for _ in ()).throw(OSError("disk gone")))
    hold.on_close(lambda: done.append("last attached"))
    with pytest.raises(OSError, match="disk gone"):
        hold.close()
    assert done == ["last attached", "first attached"]
    hold.close()  # nothing left
    assert done == ["last attached", "first attached"]
