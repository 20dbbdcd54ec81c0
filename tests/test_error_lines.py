"""Reliability, round 3 (issue 23): each defect's case, which failed before its fix. References:
plain h5py, the raw model, and the CLI's own exit code and stderr."""

from __future__ import annotations

import logging
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT, make_cfg, small_resnet

import hookrun
from hookrun.errors import ConfigError


def _clean(tmp_path, checkpoint):
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return hookrun.run(make_cfg(tmp_path / "clean", checkpoint, hooks)).path


def _patch(source):
    return {"p": {"at": "layer2", "type": "forward", "actions": [{"name": "modify_output", "op": "patch", "source": str(source)}]}}


def _damage_object_header(path, name):
    """Overwrite the first bytes of a dataset's object header, as a bad disk block would."""
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[name].id).addr
    with open(path, "r+b") as raw:
        raw.seek(addr)
        raw.write(b"\xff" * 16)


# -- 1. a corrupted patch source ---------------------------------------------------------------------
def test_a_damaged_patch_source_is_one_line_naming_the_file_and_the_capture(tmp_path, checkpoint):
    clean = _clean(tmp_path, checkpoint)
    _damage_object_header(clean, "captures/l/layer2/output")
    with pytest.raises(ConfigError, match=r"patch source .*clean/captures\.h5.* (capture|captures/l/layer2).*damaged"):
        hookrun.run(make_cfg(tmp_path, checkpoint, _patch(clean)))
    assert not (tmp_path / "captures.h5").exists()


# -- 2. a patch source that is the run's own output --------------------------------------------------
def test_a_patch_source_that_is_the_output_path_is_refused_before_anything_is_opened(tmp_path, checkpoint):
    clean = _clean(tmp_path, checkpoint)
    before = clean.read_bytes()
    cfg = make_cfg(tmp_path, checkpoint, _patch(clean), **{"output.path": str(clean), "output.overwrite": True})
    with pytest.raises(ConfigError, match=r"output\.path .* is the patch source of hooks\.p"):
        hookrun.run(cfg)
    assert clean.read_bytes() == before  # the clean run is as it was


# -- 7. hookrun.capture says when a hook never fired ----------------------------------------------------
def test_capture_warns_about_a_hook_that_never_fired(reference_model, caplog):
    hooks = {"f": {"at": "layer1.0", "type": "forward", "actions": ["record"]}}
    reference_model.layer1[0].forward = lambda x: x  # noqa: ARG005  (never runs its children)
    hooks["g"] = {"at": "layer1.0.conv1", "type": "forward", "actions": ["record"]}
    with caplog.at_level(logging.WARNING, logger="hookrun"), torch.no_grad(), hookrun.capture(reference_model, hooks):
        reference_model(torch.zeros(1, 3, 32, 32))
    assert "hook 'g' never fired: module 'layer1.0.conv1' did not run in the block" in caplog.text
    assert "hook 'f'" not in caplog.text


# -- 8. inspect of a file without a config attribute ------------------------------------------------
@pytest.mark.slow
def test_inspect_of_a_file_without_config_says_what_is_missing(tmp_path, checkpoint):
    path = _clean(tmp_path, checkpoint)
    with h5py.File(path, "a") as f:
        for key in ("config", "model_class", "device", "steps_complete", "samples_complete"):
            del f.attrs[key]
    proc = subprocess.run([sys.executable, "-m", "hookrun.inspect", str(path), "--no-stats"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "None" not in proc.stdout
    assert "12 samples" in proc.stdout  # counted from /samples/index
    assert "  missing   config, model_class, device, steps_complete, samples_complete" in proc.stdout


# -- 6. run(cfg, model=m) gives the model back as it went in ------------------------------------------
def test_run_with_a_live_model_restores_its_mode_and_flags(tmp_path, checkpoint, dataset):
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.train()
    model.layer1[0].relu.inplace = True
    before = {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()}
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    hooks = {"g": {"at": "layer1", "type": "tensor", "actions": ["record"]}}
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "mode": "grad", "progress": False, "hooks": hooks,
           "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "output": {"path": str(tmp_path / "c.h5")}}
    hookrun.run(cfg, model=model, dataset=dataset)
    assert {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()} == before
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    with h5py.File(tmp_path / "c.h5") as f:
        assert np.isfinite(f["captures/g/layer1/grad"][:]).all()


# -- 3. batches that do not fit the forward ---------------------------------------------------------
class TakesX(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


class DictItems(torch.utils.data.Dataset):
    def __init__(self, target_none: bool = False) -> None:
        self.x, self.none = torch.randn(6, 4), target_none

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return {"image": self.x[i], "label": None if self.none else i % 3}


def _cfg(tmp_path, **over):
    hooks = {"r": {"at": "lin", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return {"data": {"batch_size": 2}, "device": "cpu", "progress": False, "hooks": hooks,
            "output": {"path": str(tmp_path / "c.h5")}, **over}


def test_dict_keys_that_are_not_the_forwards_arguments_name_the_mapping(tmp_path):
    with pytest.raises(ConfigError, match=r"items' keys \(image; target label\) .* TakesX\.forward takes x, not image; "
                                          r"map them with data.inputs='\{x: image\}'"):
        hookrun.run(_cfg(tmp_path), model=TakesX(), dataset=DictItems())
    assert not (tmp_path / "c.h5").exists()
    cfg = _cfg(tmp_path)
    cfg["data"]["inputs"] = {"x": "image"}  # the line the message gives works
    ds = DictItems()
    path = hookrun.run(cfg, model=TakesX(), dataset=ds).path
    with h5py.File(path) as f, torch.no_grad():
        np.testing.assert_allclose(f["captures/r/lin/output"][:], TakesX()(ds.x).numpy(), rtol=1e-6)


class KwModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, input_ids, attention_mask):
        return self.emb(input_ids) * attention_mask.unsqueeze(-1)


class FeatureDictAndLabel(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i, i + 1, 2]), "attention_mask": torch.tensor([1, 1, 0])}, i % 2


def test_a_feature_dict_with_a_label_is_spread_as_keyword_arguments(tmp_path):
    hooks = {"e": {"at": "emb", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = _cfg(tmp_path, hooks=hooks)
    path = hookrun.run(cfg, model=KwModel(), dataset=FeatureDictAndLabel()).path
    ids = torch.stack([FeatureDictAndLabel()[i][0]["input_ids"] for i in range(4)])
    with h5py.File(path) as f, torch.no_grad():
        np.testing.assert_array_equal(f["captures/e/emb/output"][:], KwModel().emb(ids).numpy())
        np.testing.assert_array_equal(f["samples/target"][:], [0, 1, 0, 1])


def test_a_none_target_is_exit_2_naming_the_dataset_and_the_target(tmp_path):
    cfg = _cfg(tmp_path)
    cfg["data"]["inputs"] = {"x": "image"}
    with pytest.raises(ConfigError, match=r"data\.target: .* None.*data\.dataset.*data\.target=null") as info:
        hookrun.run(cfg, model=TakesX(), dataset=DictItems(target_none=True))
    assert info.value.exit_code == 2


def test_cross_entropy_on_token_logits_names_both_shapes_and_loss_lm(tmp_path):
    class TokenLogits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 5)

        def forward(self, x):
            return self.lin(x).unsqueeze(1).expand(-1, 3, -1)  # (B, T, V)

    data = torch.utils.data.TensorDataset(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
    cfg = _cfg(tmp_path, mode="grad", loss={"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True})
    with pytest.raises(hookrun.errors.RunError, match=r"logits of shape \(2, 3, 5\) do not fit targets of shape \(2,\).*loss=lm"):
        hookrun.run(cfg, model=TokenLogits(), dataset=data)


@pytest.mark.slow
def test_an_error_inside_the_models_forward_is_one_line_with_the_call(tmp_path):
    pytest.importorskip("transformers")
    cmd = [sys.executable, "-m", "hookrun", "model=hf", "model.model_class=T5ForConditionalGeneration",
           "~model.config", "+model.config={num_layers: 1, num_decoder_layers: 1, d_model: 16, d_ff: 32, num_heads: 2, d_kv: 8, "
           "vocab_size: 300, decoder_start_token_id: 0}", "data=text", "data.limit=1", f"hydra.run.dir={tmp_path}",
           "hooks={h: {at: encoder, type: forward, actions: [record]}}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert any("the model's forward failed: T5ForConditionalGeneration(input_ids=[" in ln and "ValueError" in ln
               for ln in err), proc.stderr[-2000:]


# -- 10. a glob over every module ---------------------------------------------------------------------
class Boxed:
    """Not a tensor (as torchvision detection's ImageList is not)."""

    def __init__(self, t):
        self.t = t


class Wrap(torch.nn.Module):
    def forward(self, x):
        return Boxed(x)


class WithWrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wrap = Wrap()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(self.wrap(x).t)


def test_a_glob_over_every_module_skips_one_without_a_tensor_and_lists_it(tmp_path, caplog):
    data = torch.utils.data.TensorDataset(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
    model = WithWrapper()
    cfg = _cfg(tmp_path, hooks={"all": {"at": "**", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(cfg, model=model, dataset=data).path
    with h5py.File(path) as f, torch.no_grad():
        assert f.attrs["status"] == "complete"
        assert "all@wrap (wrap receives no output" in f.attrs["hooks_skipped"]
        np.testing.assert_allclose(f["captures/all/lin/output"][:], model.lin(data.tensors[0]).numpy(), rtol=1e-6)
        assert "wrap" not in f["captures/all"]
    assert "skipped wrap" in caplog.text
    cfg = _cfg(tmp_path / "named", hooks={"w": {"at": "wrap", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    with pytest.raises(hookrun.errors.RunError, match="record what='output': wrap receives no output"):
        hookrun.run(cfg, model=model, dataset=data)


# -- 5. checksums: resume and inspect --verify name damaged rows -----------------------------------------
def _damage_rows(path, name, row):
    """Flip bytes inside the stored rows of a capture (its data, not its header)."""
    with h5py.File(path, "r") as f:
        ds = f[name]
        info = ds.id.get_chunk_info_by_coord((row,) + (0,) * (ds.ndim - 1))
        offset = info.byte_offset + ds.dtype.itemsize * int(np.prod(ds.shape[1:])) * (row % ds.chunks[0])
    with open(path, "r+b") as raw:
        raw.seek(offset)
        raw.write(b"\x7f\x7f\x7f\x7f")


def test_resume_refuses_rows_damaged_on_disk_and_inspect_verify_names_them(tmp_path, checkpoint):
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks, **{"output.checksum": True})
    path = hookrun.run(cfg).path
    verify = [sys.executable, "-m", "hookrun.inspect", "--verify", str(path)]
    ok = subprocess.run(verify, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "1 capture(s) checked: every row matches its checksum" in ok.stdout, ok.stderr
    _damage_rows(path, "captures/l/layer2/output", 5)
    bad = subprocess.run(verify, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stdout
    assert "damaged: /captures/l/layer2/output: rows 4..7 do not match their checksum" in bad.stderr
    with h5py.File(path, "a") as f:  # as if it had been interrupted after its last batch
        f.attrs["status"] = "interrupted"
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"resume: .*captures/l/layer2/output rows 4\.\.7 \(batch 1\) do not match their checksum"):
        hookrun.run({**cfg, "resume": True})
    assert path.read_bytes() == before  # the damaged file is left as it was, for the user to look at


# -- 9. a kill -9 at any moment: every plain-h5py view agrees with its counts --------------------------
@pytest.mark.slow
def test_hundreds_of_kills_leave_files_whose_lengths_agree_with_their_counts(tmp_path):
    """tests/kill_store.py forks a writer per kill and SIGKILLs it at a random moment of its life;
    every file left is read with plain h5py: every dataset's length equals what the counts say and
    every row equals the writer's (before the fix, 14 of 190 killed files held more rows than
    samples_complete). A kill inside a flush leaves NAME.flushing, checked against the flush before."""
    import json

    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kill_store.py"), str(tmp_path), "--kills", "150",
                          "--batches", "16"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["checked"] >= 120, result
    assert result["disagreements"] == [], result["disagreements"][:5]


KILL_IN_FLUSH = """
import json, os, sys
import h5py
import hookrun
cfg, at_flush = json.loads(sys.argv[1]), int(sys.argv[2])
calls = [0]
real = h5py.File.flush
def flush(self):
    calls[0] += 1
    if calls[0] == at_flush:
        os._exit(9)  # as a kill -9 would: the file stands aside, nothing of this flush written
    real(self)
h5py.File.flush = flush
hookrun.run(cfg)
"""


def _killed_inside_a_flush(cfg, at_flush):
    """Run `cfg` in a child process that dies inside its `at_flush`-th flush, after the file stepped
    aside and before HDF5 wrote anything of that flush."""
    import json

    out = subprocess.run([sys.executable, "-c", KILL_IN_FLUSH, json.dumps(cfg), str(at_flush)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 9, out.stderr[-2000:]


def test_a_run_killed_inside_a_flush_is_named_and_resume_recovers_it(tmp_path, checkpoint):
    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    ref = hookrun.run(make_cfg(tmp_path / "ref", checkpoint, hooks)).path
    cfg = make_cfg(tmp_path, checkpoint, hooks, **{"output.flush_every": 1})
    _killed_inside_a_flush(cfg, at_flush=4)  # the skeleton, batches 0 and 1 flushed; killed flushing batch 2
    path, aside = tmp_path / "captures.h5", tmp_path / "captures.h5.flushing"
    assert not path.exists() and aside.exists()
    with h5py.File(aside, "r") as f:  # plain h5py: what previous_flush names is whole
        steps, samples = (int(v) for v in f.attrs["previous_flush"])
        assert (steps, samples) == (1, 4)  # on disk: batch 1's flush, whose previous_flush is batch 0's
        with h5py.File(ref) as r:
            np.testing.assert_array_equal(f["captures/l/layer2/output"][:samples], r["captures/l/layer2/output"][:samples])
    with pytest.raises(hookrun.errors.NotFoundError, match=r"captures\.h5\.flushing beside it: the run was killed while it flushed; resume=true"):
        hookrun.open_run(path)
    with pytest.raises(ConfigError, match=r"captures\.h5\.flushing.* resume=true recovers its batches, output\.overwrite=true"):
        hookrun.run(cfg)  # a new run does not silently replace what the kill left
    hookrun.run({**cfg, "resume": True})
    assert path.exists() and not aside.exists()
    with h5py.File(path) as f, h5py.File(ref) as r:
        assert f.attrs["status"] == "complete"
        assert f["samples/index"].shape[0] == f.attrs["samples_complete"] == r.attrs["samples_complete"]
        np.testing.assert_array_equal(f["captures/l/layer2/output"][:], r["captures/l/layer2/output"][:])


# -- friction: compose, hints, plots ------------------------------------------------------------------
def test_compose_gives_the_config_the_cli_runs(tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    cfg = hookrun.compose("experiment=resnet_layer1", "data.batch_size=4", "data.limit=1", "device=cpu", "progress=false")
    assert cfg["data"]["batch_size"] == 4 and cfg["hooks"]["blocks"]["at"] == "layer1.*"
    assert cfg["output"]["path"].startswith("outputs/") and cfg["output"]["path"].endswith("/captures.h5")
    want = yaml.safe_load((ROOT / "conf/experiment/resnet_layer1.yaml").read_text())["hooks"]
    assert cfg["hooks"] == want  # the experiment's own hooks, as the CLI composes them
    result = hookrun.run(cfg)
    with h5py.File(result.path) as f:
        assert f.attrs["status"] == "complete" and f["captures/blocks/layer1.0/output"].shape[0] == 4
    with pytest.raises(ConfigError, match=r"model=custom model\._target_=torchvision\.models\.resnet34"):
        hookrun.compose("model=resnet34")


def test_grad_without_a_loss_lists_loss_lm(tmp_path, checkpoint):
    with pytest.raises(ConfigError, match=r"mode=grad needs a loss: .*loss=lm"):
        hookrun.run(make_cfg(tmp_path, checkpoint, None, mode="grad"))


def test_plots_of_two_runs_into_one_folder_never_replace_each_other(tmp_path, checkpoint):
    pytest.importorskip("matplotlib")
    from hookrun.cli import plot

    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    a = hookrun.run(make_cfg(tmp_path / "a", checkpoint, hooks)).path
    b = hookrun.run(make_cfg(tmp_path / "b", checkpoint, hooks, seed=3, **{"data.dataset.seed": 9})).path
    assert plot.main([str(a)]) == 0
    assert sorted(p.name for p in (a.parent / "figures").glob("*.png")) == ["fmap_l__layer2__output.png", "hist_l__layer2__output.png"]
    out = tmp_path / "shared"
    assert plot.main([str(a), "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.glob("*.png")}
    assert plot.main([str(b), "--out", str(out)]) == 0
    after = {p.name: p.read_bytes() for p in out.glob("*.png")}
    assert all(after[name] == data for name, data in first.items())  # run a's figures are untouched
    assert len(after) == 2 * len(first)
    assert plot.main([str(a), "--out", str(out)]) == 0  # the same run again: its own figures are refreshed
    assert len(list(out.glob("*.png"))) == 2 * len(first)


# -- 4. a full backward hook on a module whose output is then modified in place ---------------------------
def test_a_backward_hook_on_bn2_before_out_plus_identity_works(tmp_path, checkpoint, dataset):
    hooks = {"b": {"at": "layer1.0.bn2", "type": "backward", "actions": ["record"]}}
    cfg = make_cfg(tmp_path, checkpoint, hooks, mode="grad",
                   loss={"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True})
    path = hookrun.run(cfg).path
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.eval()
    for m in model.modules():
        if getattr(m, "inplace", False):
            m.inplace = False
    seen = {}  # bn2's input and output as copies: the reference gradients are d(loss)/d(those)
    model.layer1[0].conv2.register_forward_hook(lambda m, i, o: seen.setdefault("in", []).append(o.clone()) or seen["in"][-1])
    model.layer1[0].bn2.register_forward_hook(lambda m, i, o: seen.setdefault("out", []).append(o.clone()) or seen["out"][-1])
    grads_in, grads_out = [], []
    for start in range(0, len(dataset), 4):
        seen.clear()
        x = torch.stack([dataset[i][0] for i in range(start, start + 4)])
        y = torch.stack([dataset[i][1] for i in range(start, start + 4)])
        loss = torch.nn.functional.cross_entropy(model(x.requires_grad_(True)), y)
        g_in, g_out = torch.autograd.grad(loss, [seen["in"][0], seen["out"][0]])
        grads_in.append(g_in)
        grads_out.append(g_out)
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete"
        np.testing.assert_allclose(f["captures/b/layer1.0.bn2/grad_output"][:], torch.cat(grads_out).numpy(), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(f["captures/b/layer1.0.bn2/grad_input"][:], torch.cat(grads_in).numpy(), rtol=1e-4, atol=1e-7)


def test_only_rank_0_draws_a_bar_and_it_counts_its_own_batches(tmp_path, checkpoint):
    from hookrun.config.schema import load
    from hookrun.runner.prepare import prepare
    from hookrun.runner.ranks import Ranks
    from hookrun.runner.shards import ShardRun

    cfg = load(make_cfg(tmp_path, checkpoint, None, progress=True))  # 12 samples in 3 batches of 4
    bars = {}
    for rank in (0, 1):
        p = prepare(cfg)
        ShardRun(cfg, Ranks(rank=rank, world=2)).adjust(p)
        bars[rank] = (p.settings.progress, p.settings.label, len(p.settings.batches))
        p.env.close()
    assert bars[0] == (True, "hookrun rank 0/2, batches 0-0", 1)
    assert bars[1][0] is False and bars[1][2] == 2
