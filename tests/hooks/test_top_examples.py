"""top_examples: each feature's k largest activations over a run, equal to a brute-force sort (numpy
lexsort: value descending, then sample, then position) of activations computed without hookrun, by
the model's own modules called directly or a raw PyTorch forward hook on the same weights and
inputs, and equal to a sort of a `record` of the same hook point in the same run; for token rows
with padding, (batch, feature) rows with many ties, and channel maps; after an interrupted run is
resumed; and across two ranks (torchrun)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from rank_runs import TORCHRUN, cli
from torch import nn
from warm_python import python as warm

import hookrun
from hookrun.analysis import open_run
from hookrun.cli.inspect_command import main as inspect_main
from hookrun.errors import ConfigError
from hookrun.output.process import Interrupted
from hookrun.store.live import settled

K = 5


def brute(values: np.ndarray, samples: np.ndarray, positions: np.ndarray, k: int = K):
    """Per feature (column of `values`), the k first rows sorted by value desc, sample, position."""
    out = []
    for f in range(values.shape[1]):
        order = np.lexsort((positions, samples, -values[:, f].astype(np.float64)))[:k]
        out.append((values[order, f], samples[order], positions[order]))
    return out


def assert_top(path, hook: str, module: str, values, samples, positions, k: int = K, close: bool = False) -> None:
    """The file's top-k against a brute-force sort of `values`: the same samples and positions, and the
    same values (`close`: a reference computed outside the run, equal to float32 rounding)."""
    with h5py.File(path, "r", locking=False) as f:
        g = f[f"captures/{hook}/{module}"]
        got_v, got_s, got_p = g["top.values"][()], g["top.samples"][()], g["top.positions"][()]
    for f_, (v, s, p) in enumerate(brute(values, samples, positions, k)):
        np.testing.assert_array_equal(got_s[f_, : len(s)], s, err_msg=f"feature {f_}")
        np.testing.assert_array_equal(got_p[f_, : len(p)], p, err_msg=f"feature {f_}")
        if close:
            np.testing.assert_allclose(got_v[f_, : len(v)], v, rtol=1e-5, atol=1e-6, err_msg=f"feature {f_}")
        else:
            np.testing.assert_array_equal(got_v[f_, : len(v)], v.astype(np.float32), err_msg=f"feature {f_}")


@pytest.fixture(scope="module")
def tiny_lm_acts():
    """The reference for text_cfg's hook point, without hookrun's runner: the shipped tiny_lm's 14
    samples of the same text through a raw forward hook on transformer.h.1.mlp.act; its token rows
    (attention mask 1) as (values, sample index, position)."""
    from hookrun.data import text
    from hookrun.models import tiny_lm

    ds = text(files="pydoc_topics", max_length=20, limit=14)
    ids = torch.stack([ds[i]["input_ids"] for i in range(len(ds))])
    mask = torch.stack([ds[i]["attention_mask"] for i in range(len(ds))])
    model, seen = tiny_lm().eval(), []
    handle = model.transformer.h[1].mlp.act.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        for lo in range(0, len(ids), 4):  # the run's batches of 4
            model(input_ids=ids[lo:lo + 4], attention_mask=mask[lo:lo + 4])
    handle.remove()
    act, keep = torch.cat(seen).numpy(), mask.numpy() == 1
    samples, positions = np.nonzero(keep)
    return act[keep], samples, positions




def text_cfg(path, **extra) -> dict:
    return {"model": {"_target_": "hookrun.models.tiny_lm"},
            "data": {"dataset": {"_target_": "hookrun.data.text", "files": "pydoc_topics", "max_length": 20, "limit": 14},
                     "batch_size": 4, "store": ["input_ids", "attention_mask"]},
            "hooks": {"act": {"at": "transformer.h.1.mlp.act", "type": "forward", "actions": [
                {"name": "top_examples", "k": K, "context": 3}, {"name": "record", "rows": "token", "dtype": "float32"}]},
                "stop": {"at": "transformer.h.0", "type": "forward",
                         "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}},
            "output": {"path": str(path), "flush_every": 1}, "device": "cpu", "progress": False, **extra}


def test_token_rows_equal_a_brute_force_sort_and_the_reader_gives_their_tokens(tmp_path, tiny_lm_acts):
    path = hookrun.run(text_cfg(tmp_path / "t.h5")).path
    assert_top(path, "act", "transformer.h.1.mlp.act", *tiny_lm_acts, close=True)  # against a raw hook, no hookrun
    with open_run(path) as run:
        rec = run["transformer.h.1.mlp.act", "output"][:]
        ts, tp = run.file["samples/token_sample"][:], run.file["samples/token_position"][:]
        assert_top(path, "act", "transformer.h.1.mlp.act", rec, ts, tp)
        assert run.top_example_modules == {"transformer.h.1.mlp.act": rec.shape[1]}
        ex = run.top_examples("transformer.h.1.mlp.act", 3)
        order = brute(rec, ts, tp)[3]
        assert [e["sample"] for e in ex] == order[1].tolist() and [e["position"] for e in ex] == order[2].tolist()
        ids, mask = run.file["samples/input_ids"][:], run.file["samples/attention_mask"][:]
        for e in ex:
            row = ids[list(run.samples).index(e["sample"])]
            assert mask[list(run.samples).index(e["sample"])][e["position"]] == 1  # padding never enters
            lo = max(0, e["position"] - 3)
            want = bytes(int(t) - 3 for t in row[lo:e["position"] + 4] if t >= 3).decode("utf-8", "replace")
            assert "".join(c for c in e["context"] if not c.startswith("<")) == want
            assert e["context"][e["at"]] == (bytes([int(row[e["position"]]) - 3]).decode("utf-8", "replace")
                                             if row[e["position"]] >= 3 else "<bos>")
        with pytest.raises(LookupError, match="closest"):
            run.top_examples("transformer.h.1.mlp.ac", 0)
        with pytest.raises(LookupError, match="features 0"):
            run.top_examples("transformer.h.1.mlp.act", 10_000)


class Rounded(nn.Module):
    """A layer whose outputs repeat (rounded to halves): many ties; a channel map beside it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(12, 6)
        self.round = nn.Identity()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.round(torch.round(self.lin(x) * 2) / 2)
        img = x[:, :12].reshape(-1, 3, 2, 2).repeat(1, 1, 2, 2)
        return r.sum() + self.conv(img).sum()


def test_ties_go_to_the_earlier_sample_and_channel_maps_use_each_channels_max(tmp_path):
    from hookrun.data import RandomTensors

    cfg = {"hooks": {"r": {"at": "round", "type": "forward", "actions": [{"name": "top_examples", "k": K}, "record"]},
                     "c": {"at": "conv", "type": "forward", "actions": [{"name": "top_examples", "k": K}, "record"]}},
           "data": {"batch_size": 7}, "output": {"path": str(tmp_path / "r.h5"), "dtype": "float32"},
           "device": "cpu", "progress": False}
    data = RandomTensors(n=40, shape=(12,))
    path = hookrun.run(cfg, model=Rounded(), dataset=data).path
    ref, x = Rounded(), torch.stack([data[i][0] for i in range(len(data))])  # the same weights and inputs, no hookrun
    with torch.no_grad():
        ref_r = (torch.round(ref.lin(x) * 2) / 2).numpy()  # the model's own modules, called directly
        ref_c = ref.conv(x[:, :12].reshape(-1, 3, 2, 2).repeat(1, 1, 2, 2)).amax(dim=(2, 3)).numpy()
    every = np.arange(len(x))
    assert_top(path, "r", "round", ref_r, every, np.full(len(x), -1), close=True)
    assert_top(path, "c", "conv", ref_c, every, np.full(len(x), -1), close=True)
    with open_run(path) as run:
        r = run["round", "output"][:]
        assert len(np.unique(r[:, 0])) < 15  # ties are there to break
        n = np.arange(len(r))
        assert_top(path, "r", "round", r, n, np.full(len(r), -1))
        c = run["conv", "output"][:].max(axis=(2, 3))  # (sample, channel): the max over space
        assert_top(path, "c", "conv", c, n, np.full(len(r), -1))
        ex = run.top_examples("conv", 1)
        assert ex[0]["position"] is None and ex[0]["context"] is None and ex[0]["at"] is None


def test_an_interrupted_run_resumed_gives_the_brute_force_top_k(tmp_path, tiny_lm_acts):
    from toy_models import STOP_AT

    cfg = text_cfg(tmp_path / "t.h5")
    STOP_AT[:] = [2]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    with h5py.File(cfg["output"]["path"], "r", locking=False) as f:
        assert f.attrs["status"] == "interrupted" and "top.values" not in f["captures/act/transformer.h.1.mlp.act"]
        assert "state" in f  # the running top-k of the kept batches
    resume_and_check_top(cfg, tiny_lm_acts)


def resume_and_check_top(cfg: dict, reference) -> None:
    """Resume the stopped run `cfg` to the end; its top examples equal a brute-force sort of the
    raw-hook `reference` and of the record of the same hook point (all 14 samples' token rows)."""
    cfg["resume"] = True
    assert hookrun.run(cfg).status == "complete"
    assert inspect_main([str(cfg["output"]["path"]), "--verify"]) == 0  # the resumed top.* carry checksums too
    assert_top(cfg["output"]["path"], "act", "transformer.h.1.mlp.act", *reference, close=True)
    with open_run(cfg["output"]["path"]) as run:
        rec = run["transformer.h.1.mlp.act", "output"][:]
        ts, tp = run.file["samples/token_sample"][:], run.file["samples/token_position"][:]
    assert len(np.unique(ts)) == 14
    assert_top(cfg["output"]["path"], "act", "transformer.h.1.mlp.act", rec, ts, tp)


def test_bad_top_examples_are_one_line_before_any_batch(tmp_path):
    from hookrun.data import RandomTensors

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(12, 3)

        def forward(self, x):
            return self.lin(x).sum(1)  # (batch,): no feature axis

    base = {"data": {"batch_size": 4}, "output": {"path": str(tmp_path / "x.h5")}, "device": "cpu", "progress": False}
    with pytest.raises(ConfigError, match=r"k=0; expected a whole number >= 1"):
        hookrun.run({**base, "hooks": {"t": {"at": "lin", "type": "forward", "actions": [{"name": "top_examples", "k": 0}]}}},
                    model=Flat(), dataset=RandomTensors(n=8, shape=(12,)))
    with pytest.raises(ConfigError, match=r"has shape \(1,\), without a feature axis"):
        hookrun.run({**base, "hooks": {"t": {"at": "", "type": "forward", "actions": [{"name": "top_examples"}]}}},
                    model=Flat(), dataset=RandomTensors(n=8, shape=(12,)))
    with pytest.raises(ConfigError, match=r"lin gives no tensor output.5 in one sample's forward; it gives: output"):
        hookrun.run({**base, "hooks": {"t": {"at": "lin", "type": "forward", "actions": [{"name": "top_examples", "what": "output.5"}]}}},
                    model=Flat(), dataset=RandomTensors(n=8, shape=(12,)))
    assert not (tmp_path / "x.h5").exists()
    # k above the activations a feature can get: 8 samples of (batch, feature); 2 texts x 16 tokens
    lin = {"t": {"at": "lin", "type": "forward", "actions": [{"name": "top_examples", "k": 9}]}}
    with pytest.raises(ConfigError, match=r"top_examples k=9: this run gives each feature of lin at most 8 activations "
                                          r"\(8 samples\); give k <= 8"):
        hookrun.run({**base, "hooks": lin}, model=Flat(), dataset=RandomTensors(n=8, shape=(12,)))
    text = {"_target_": "hookrun.data.text", "files": "pydoc_topics", "max_length": 16, "limit": 2}
    with pytest.raises(ConfigError, match=r"k=33: .* at most 32 activations \(2 samples x 16 tokens\); give k <= 32"):
        hookrun.run({**base, "model": {"_target_": "hookrun.models.tiny_lm"}, "data": {"dataset": text, "batch_size": 2},
                     "hooks": {"t": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "top_examples", "k": 33}]}}})
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.slow
def test_two_ranks_merge_to_the_brute_force_top_k(tmp_path):
    hooks = ("hooks={c: {at: features.0, type: forward, actions: [{name: top_examples, k: 5}, {name: record, what: output}]},"
             " h: {at: head, type: forward, actions: [{name: top_examples, k: 5}, {name: record, what: output}]}}")
    args = ["model=custom", "model._target_=my_pkg.Net", "+model.width=4", "data=custom", "data.dataset._target_=my_pkg.MyData",
            "+data.dataset.n=22", "data.batch_size=4", "device=cpu", "progress=false", "output.dtype=float32", hooks]
    proc = cli(*args, "hydra.run.dir=two", cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / "two" / "captures.h5"
    with open_run(path) as run:
        samples = run.samples
        assert sorted(samples.tolist()) == list(range(22)) and run.attrs["world_size"] == 2
        c = run["features.0", "output"][:].max(axis=(2, 3))
        h = run["head", "output"][:]
    for shard in sorted((tmp_path / "two").glob("captures.rank-*.h5")):
        with h5py.File(shard, "r", locking=False) as f:  # each rank's own top-k covers only its samples
            assert f["captures/h/head/top.samples"].shape == (10, 5)
    assert_top(path, "c", "features.0", c, samples, np.full(len(samples), -1))
    assert_top(path, "h", "head", h, samples, np.full(len(samples), -1))


def test_sae_eval_keeps_each_latents_top_examples(tmp_path):
    import json

    import safetensors.torch

    folder = tmp_path / "sae"
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    safetensors.torch.save_file({"W_enc": torch.randn(128, 64, generator=g) * 0.1, "W_dec": torch.randn(64, 128, generator=g),
                                 "b_enc": torch.zeros(64), "b_dec": torch.zeros(128)}, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": 128, "d_sae": 64, "dtype": "float32",
                                                 "apply_b_dec_to_input": True, "normalize_activations": "none"}))
    cfg = hookrun.compose("experiment=sae_eval", f"params.sae={folder}", f"output.path={tmp_path / 's.h5'}",
                          "data.dataset.limit=12", "data.batch_size=4", "device=cpu", "progress=false")
    cfg["hooks"]["latents"]["actions"][0]["dtype"] = "float32"  # the brute force reads the record exactly
    path = hookrun.run(cfg).path
    with open_run(path) as run:
        rec = run["transformer.h.3.sae.latents", "output"][:]
        ts, tp = run.file["samples/token_sample"][:], run.file["samples/token_position"][:]
        assert run.top_example_modules == {"transformer.h.3.sae.latents": 64}
    assert_top(path, "latents", "transformer.h.3.sae.latents", rec, ts, tp, k=20)


def test_a_killed_run_resumed_gives_the_brute_force_top_k(tmp_path, tiny_lm_acts):
    import json

    from rank_runs import ENV

    cfg = text_cfg(tmp_path / "k.h5")
    cfg["hooks"]["stop"]["actions"] = [{"_target_": "rank_helpers.kill_when_told", "_partial_": True}]
    code = f"import hookrun, json; hookrun.run(json.loads({json.dumps(json.dumps(cfg))}))"
    proc = warm(["-c", code], env={**__import__("os").environ, **ENV, "HOOKRUN_TEST_KILL": "0:3"}, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL at batch 3: no end of run, no close
    settled(Path(cfg["output"]["path"]))  # (the killed writer's flush helper holds the lock until its last message is applied)
    with h5py.File(cfg["output"]["path"], "r") as f:
        assert f.attrs["status"] == "running" and 1 <= f.attrs["steps_complete"] <= 3
    resume_and_check_top(cfg, tiny_lm_acts)


def test_the_state_is_written_in_two_slots_in_place(tmp_path):
    from hookrun.store.run_state import RunState, read_state

    states = RunState()
    with h5py.File(tmp_path / "s.h5", "w") as f:
        for steps in range(1, 41):
            states.keep(steps, {"hooks.t.actions.0@m": {"values": np.full((256, 20), steps, np.float32)}})
            states.flush(f, steps)
            if steps == 2:
                size = f.id.get_filesize()
        f.flush()
        assert f.id.get_filesize() <= size + 4096  # 38 more flushes, no more space
        assert sorted(f["state/hooks.t.actions.0@m"]) == ["a", "b"]
        assert read_state(f, 40)["hooks.t.actions.0@m"]["values"][0, 0] == 40
        assert read_state(f, 39)["hooks.t.actions.0@m"]["values"][0, 0] == 39  # the flush before: a kill inside this one
        assert read_state(f, 38) == {}
        states.keep(41, {"hooks.t.actions.0@m": {"values": np.zeros((256, 20), np.float32)}})
        states.flush(f, 40)  # a snapshot of other batches than the flush's is never written
        assert read_state(f, 41) == {}


def test_a_k_larger_than_a_chunk_merges_k_rows_at_a_time_to_the_brute_force_top_k(tmp_path, tiny_lm_acts, monkeypatch):
    """A k whose running state fills a chunk (k=100000 on 512 features): the merge took one row at a
    time (minutes per batch); now at least k rows at a time, to the same top-k."""
    from hookrun.hooks.actions import top_examples

    monkeypatch.setattr(top_examples, "CHUNK_ELEMENTS", 1)  # (every chunk is k rows)
    path = hookrun.run(text_cfg(tmp_path / "t.h5")).path
    assert_top(path, "act", "transformer.h.1.mlp.act", *tiny_lm_acts, close=True)


def test_capture_keeps_the_top_k_of_its_block_as_a_brute_force_sort(tiny_lm_acts):
    """hookrun.capture ends stateful actions with the block: cap holds top.values/samples/positions,
    equal to a sort of a raw hook's activations (samples: the block's numbers, 0.. across forwards)."""
    from hookrun.data import text
    from hookrun.errors import RunError
    from hookrun.models import tiny_lm

    ds = text(files="pydoc_topics", max_length=20, limit=14)
    ids = torch.stack([ds[i]["input_ids"] for i in range(len(ds))])
    mask = torch.stack([ds[i]["attention_mask"] for i in range(len(ds))])
    model = tiny_lm().eval()
    hooks = {"act": {"at": "transformer.h.1.mlp.act", "type": "forward", "actions": [{"name": "top_examples", "k": K}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        for lo in range(0, len(ids), 4):
            model(input_ids=ids[lo:lo + 4], attention_mask=mask[lo:lo + 4])
    got = [cap["transformer.h.1.mlp.act", role].numpy() for role in ("top.values", "top.samples", "top.positions")]
    assert got[0].shape == (tiny_lm_acts[0].shape[1], K)
    for f, (v, s, p) in enumerate(brute(*tiny_lm_acts)):
        np.testing.assert_array_equal(got[1][f], s, err_msg=f"feature {f}")
        np.testing.assert_array_equal(got[2][f], p, err_msg=f"feature {f}")
        np.testing.assert_allclose(got[0][f], v, rtol=1e-5, atol=1e-6, err_msg=f"feature {f}")
    with pytest.raises(RunError, match="top_examples does not run around model.generate"), \
            torch.no_grad(), hookrun.capture(model, hooks):
        model.generate(input_ids=ids[:2, :4], attention_mask=mask[:2, :4], max_new_tokens=2, do_sample=False)


def test_the_reports_latent_histograms_count_the_real_tokens_only(tmp_path, tiny_lm_acts, capsys):
    """A (sample, position, feature) record beside top_examples: the report's histogram of a latent
    counted the padding positions too (256 values for 199 tokens); now exactly the raw hook's values
    at attention_mask 1, the tokens top examples are taken from."""
    from hookrun.analysis.report.latents import latents
    from hookrun.analysis.report.run_sections import Budget

    cfg = text_cfg(tmp_path / "t.h5")
    cfg["hooks"]["act"]["actions"][1] = {"name": "record", "dtype": "float32"}  # rows: samples, padding and all
    path = hookrun.run(cfg).path
    values = tiny_lm_acts[0]
    with open_run(path) as run:
        assert run["transformer.h.1.mlp.act", "output"].shape[:2] == (14, 20)
        assert run.file["samples/attention_mask"][:].sum() < 14 * 20  # (there is padding)
        (item,) = latents(run, Budget())[0]["items"]
        from hookrun.cli.plot_command import plot_run

        drawn = plot_run(run, tmp_path / "figures")  # plot draws no latent: it said "drawn as lens or latent pictures"
    assert not [p for p in drawn if "top" in p.name]
    assert "top.values: shown in the report's Latents section (python -m hookrun.report)" in capsys.readouterr().out
    for f in (0, 5):
        bars = item["features"][f]["hist"]["data"][0]
        x, width = np.asarray(bars["x"]), float(bars["width"])
        assert sum(bars["y"]) == len(values)
        np.testing.assert_allclose([x[0] - width / 2, x[-1] + width / 2], [values[:, f].min(), values[:, f].max()], rtol=1e-5, atol=1e-6)
        counts, _ = np.histogram(values[:, f], bins=len(x), range=(values[:, f].min(), values[:, f].max()))
        assert np.abs(np.asarray(bars["y"]) - counts).sum() <= 2  # (float32 values at a bin's edge)
    import shutil

    import h5py

    moved = shutil.copy(path, tmp_path / "moved.h5")
    with h5py.File(moved, "r+") as f:  # samples numbered from 100 (a shard's, a subset's): a sample's id is not its row
        f["samples/index"][...] = f["samples/index"][:] + 100
    with open_run(moved) as run:
        (again,) = latents(run, Budget())[0]["items"]
    assert [e["hist"]["data"][0]["y"] for e in again["features"][:6]] == [e["hist"]["data"][0]["y"] for e in item["features"][:6]]
