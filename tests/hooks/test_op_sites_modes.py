"""Op sites everywhere hooks work (issue 21): generate, early_stop, many ranks, resume. References:
the tests' own TorchFunctionMode (tests/helpers/op_models.py), transformers' output_attentions on the inputs
the file stored, raw module hooks, and an uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import HELPERS, ROOT
from op_models import OwnCalls, gpt2
from torch.overrides import TorchFunctionMode

import hookrun
from hookrun.models import hf

transformers = pytest.importorskip("transformers")
RECORD = {"name": "record", "what": "output"}


def attention_reference(cfg: dict, path, inputs_from: list | None = None, hook: str = "p") -> tuple[tuple, dict]:
    """output_attentions of the model the run built (same class, config, seed) on the inputs the file
    stored (or the files `inputs_from`, in order), and the file's records of `p`."""
    torch.manual_seed(cfg["seed"])
    model = hf(**{k: v for k, v in cfg["model"].items() if k not in ("_target_", "checkpoint")}).eval()
    stored = {"input_ids": [], "attention_mask": []}
    for source in inputs_from or [path]:
        with h5py.File(source) as f:
            for k, v in stored.items():
                v.append(torch.from_numpy(f[f"samples/{k}"][:]))
    ids, mask = torch.cat(stored["input_ids"]), torch.cat(stored["attention_mask"])
    with h5py.File(path) as f:
        got = {name.replace("%2F", "/"): f[f"captures/{hook}/{name}/output"][:] for name in f[f"captures/{hook}"]}
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions, got


def softmax_config(tmp_path, *over: str, limit: int = 3) -> dict:
    cfg = hookrun.compose("model=hf", "data=text", "data.batch_size=2", f"data.limit={limit}", "device=cpu", "progress=false",
                          f"output.path={tmp_path / 'c.h5'}", *over)
    cfg["hooks"] = {"p": {"at": "transformer.h.*.attn/softmax", "type": "forward", "actions": [RECORD]}}
    return cfg


def test_the_gpt2_attention_experiment_records_every_head_of_every_layer(tmp_path):
    cfg = hookrun.compose("experiment=gpt2_attention", "device=cpu", "progress=false", f"output.path={tmp_path / 'a.h5'}")
    path = hookrun.run(cfg).path
    want, got = attention_reference(cfg, path, hook="attn")
    assert sorted(got) == [f"transformer.h.{i}.attn/softmax.0" for i in range(len(want))]
    for i, pattern in enumerate(want):
        assert got[f"transformer.h.{i}.attn/softmax.0"].shape == (8, 4, 32, 32)
        np.testing.assert_allclose(got[f"transformer.h.{i}.attn/softmax.0"], pattern.numpy(), rtol=1e-5, atol=1e-6)


# -- generate ---------------------------------------------------------------------------------------
class Halve(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 0.5 if getattr(func, "__name__", "") == "softmax" else out


def test_generate_fires_op_sites_at_every_model_call(tmp_path):
    from toy_lm import EOS, PAD, VOCAB, Prompts

    def eager_lm():
        model = gpt2(vocab=VOCAB)
        model.generation_config.pad_token_id, model.generation_config.eos_token_id = PAD, EOS
        return model

    ds, n_new, size = Prompts(), 4, 3
    want, new = [], []  # per batch: block 1's residual midpoint at each model call; the new tokens
    model = eager_lm()
    for start in range(0, len(ds), size):
        batch = {k: torch.stack([ds[i][k] for i in range(start, start + size)]) for k in ("input_ids", "attention_mask")}
        with torch.no_grad(), OwnCalls(model) as ref:
            out = model.generate(**batch, max_new_tokens=n_new, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
        want.append([v for name, v in ref.calls if name == "transformer.h.1/add.0"])
        new.append(out[:, batch["input_ids"].shape[1]:])
    assert [len(w) for w in want] == [n_new, n_new]  # the prompt's call, then one per new token
    cfg = {"mode": "generate", "generate": {"max_new_tokens": n_new}, "device": "cpu", "progress": False,
           "data": {"batch_size": size}, "output": {"path": str(tmp_path / "g.h5")},
           "hooks": {"mid": {"at": "transformer.h.1/add.0", "type": "forward", "actions": [{**RECORD, "rows": "token"}]}}}
    path = hookrun.run(cfg, model=eager_lm(), dataset=ds).path
    with h5py.File(path) as f:
        rows = f["captures/mid/transformer.h.1%2Fadd.0/output"][:]
        sample, position = f["samples/token_sample"][:], f["samples/token_position"][:]
        prompt_len = f["samples/prompt_length"][:]
        np.testing.assert_array_equal(f["samples/generated_ids"][:, :n_new], torch.cat(new).numpy())
    assert len(rows) == len(sample) > len(ds) * int(prompt_len.min())
    for row, s, p in zip(rows, sample, position, strict=True):
        b, i = divmod(int(s), size)
        real = ds[int(s)]["attention_mask"].nonzero().flatten()
        call, col = (0, int(real[p])) if p < prompt_len[s] else (int(p - prompt_len[s] + 1), 0)
        np.testing.assert_allclose(row, want[b][call][i, col].numpy(), rtol=1e-5, atol=1e-6)
    # a modify on an op site acts at every call inside generate: the text a TorchFunctionMode of the test's own gives
    model, halve = eager_lm(), Halve()
    attn = model.transformer.h[0].attn
    handles = [attn.register_forward_pre_hook(lambda m, a: (halve.__enter__(), None)[1]),
               attn.register_forward_hook(lambda m, a, o: (halve.__exit__(None, None, None), None)[1])]
    with torch.no_grad():
        batch = {k: torch.stack([ds[i][k] for i in range(size)]) for k in ("input_ids", "attention_mask")}
        steered = model.generate(**batch, max_new_tokens=n_new, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
    for h in handles:
        h.remove()
    assert not torch.equal(steered, model.generate(**batch, max_new_tokens=n_new, do_sample=False, pad_token_id=PAD,
                                                   eos_token_id=EOS))
    cfg["hooks"] = {"s": {"at": "transformer.h.0.attn/softmax", "type": "forward",
                          "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5, "positions": "all"}]}}
    cfg["output"]["path"], cfg["data"]["limit"] = str(tmp_path / "s.h5"), 1
    with h5py.File(hookrun.run(cfg, model=eager_lm(), dataset=ds).path) as f:
        np.testing.assert_array_equal(f["samples/generated_ids"][:], steered[:, batch["input_ids"].shape[1]:].numpy())


# -- early_stop -------------------------------------------------------------------------------------
def test_early_stop_cuts_after_an_op_sites_module_and_keeps_its_records(tmp_path):
    cfg = softmax_config(tmp_path, "early_stop=true")
    cfg["hooks"]["p"]["at"] = "transformer.h.0.attn/softmax"
    torch.manual_seed(cfg["seed"])
    model = hf(**{k: v for k, v in cfg["model"].items() if k not in ("_target_", "checkpoint")}).eval()
    sizes = []
    model.transformer.h[1].register_forward_pre_hook(lambda m, a, kw: sizes.append(len((a or (kw["hidden_states"],))[0])),
                                                     with_kwargs=True)
    path = hookrun.run(cfg, model=model).path
    assert sizes == [1, 1]  # only the two one-sample probes (op sites', early_stop's) ran block 1: no batch did
    want, _ = attention_reference(cfg, path)
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete" and f["samples/index"].shape == (6,)
        np.testing.assert_allclose(f["captures/p/transformer.h.0.attn%2Fsoftmax.0/output"][:], want[0].numpy(),
                                   rtol=1e-5, atol=1e-6)


# -- many ranks -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_torchrun_ranks_record_each_layers_pattern(tmp_path):
    hooks = "hooks={p: {at: 'transformer.h.*.attn/softmax', type: forward, actions: [{name: record, what: output}]}}"
    args = ["model=hf", "data=text", "data.batch_size=2", "data.limit=4", "device=cpu", "progress=false", hooks,
            "hydra.run.dir=run"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HELPERS}", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                           "hookrun", *args], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = tmp_path / "run" / "captures.h5"
    assert (tmp_path / "run" / "captures.rank-00001.h5").exists()
    cfg = hookrun.compose(*args[:-2])
    shards = [tmp_path / "run" / f"captures.rank-0000{r}.h5" for r in (0, 1)]  # (the view holds no data.store columns)
    want, got = attention_reference(cfg, merged, inputs_from=shards)
    with h5py.File(merged) as f:
        assert f.attrs["world_size"] == 2 and f["samples/index"].shape == (8,)
    for i, pattern in enumerate(want):
        np.testing.assert_allclose(got[f"transformer.h.{i}.attn/softmax.0"], pattern.numpy(), rtol=1e-5, atol=1e-6)


# -- resume -----------------------------------------------------------------------------------------
def test_resume_after_an_interrupt_gives_the_uninterrupted_file(tmp_path):
    from toy_models import STOP_AT

    from hookrun.output.process import Interrupted

    cfg = softmax_config(tmp_path, limit=4)
    cfg["hooks"]["stop"] = {"at": "transformer.h.0/add.0", "type": "forward",  # a user action on an op site
                            "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}
    full = hookrun.run({**cfg, "output": {**cfg["output"], "path": str(tmp_path / "full.h5")}}).path
    STOP_AT[:] = [1]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    part = cfg["output"]["path"]
    with h5py.File(part) as f:
        assert f.attrs["status"] == "interrupted" and f["samples/index"].shape == (4,)
    hookrun.run({**cfg, "resume": True})
    with h5py.File(full) as a, h5py.File(part) as b:
        assert b.attrs["status"] == "complete"
        for name in ("transformer.h.0.attn%2Fsoftmax.0", "transformer.h.1.attn%2Fsoftmax.0"):
            np.testing.assert_array_equal(a[f"captures/p/{name}/output"][:], b[f"captures/p/{name}/output"][:])
        np.testing.assert_array_equal(a["samples/index"][:], b["samples/index"][:])
    want, got = attention_reference(cfg, part)
    np.testing.assert_allclose(got["transformer.h.1.attn/softmax.0"], want[1].numpy(), rtol=1e-5, atol=1e-6)


def test_resume_keeps_a_record_limit_on_an_op_site_with_many_calls(tmp_path):
    """`at: MODULE/FN` (every call) stores MODULE/FN.k; resume counts those rows against `limit`."""
    from toy_models import STOP_AT

    from hookrun.output.process import Interrupted

    cfg = softmax_config(tmp_path, limit=8)
    cfg["hooks"]["p"]["actions"] = [{"name": "record", "what": "output", "limit": 3}]
    cfg["hooks"]["stop"] = {"at": "transformer.h.0", "type": "forward",
                            "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}
    full = hookrun.run({**cfg, "output": {**cfg["output"], "path": str(tmp_path / "full.h5")}}).path
    STOP_AT[:] = [1]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    hookrun.run({**cfg, "resume": True})
    with h5py.File(full) as a, h5py.File(cfg["output"]["path"]) as b:
        for name in ("transformer.h.0.attn%2Fsoftmax.0", "transformer.h.1.attn%2Fsoftmax.0"):
            assert b[f"captures/p/{name}/output"].shape[0] == a[f"captures/p/{name}/output"].shape[0] == 3
            np.testing.assert_array_equal(a[f"captures/p/{name}/output"][:], b[f"captures/p/{name}/output"][:])
