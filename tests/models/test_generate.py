"""mode=generate against Hugging Face generate with raw PyTorch hooks, on the same weights and prompts."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from toy_lm import EOS, PAD, WIDTH, Prompts, tiny_gpt2

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("transformers")

N_NEW, BATCH = 6, 4
VECTOR = torch.randn(WIDTH, generator=torch.Generator().manual_seed(5)).tolist()
RECORD = {"name": "record", "what": "output", "rows": "token"}


def cfg(tmp_path, hooks=None, name="captures.h5", generate=None, **over) -> dict:
    c = {
        "model": {"_target_": "toy_lm.tiny_gpt2"},
        "data": {"dataset": {"_target_": "toy_lm.Prompts"}, "batch_size": BATCH},
        "mode": "generate", "generate": {"max_new_tokens": N_NEW, **(generate or {})},
        "device": "cpu", "hooks": hooks, "progress": False,
        "output": {"path": str(tmp_path / name)},
    }
    c.update(over)
    return c


def steer(factor: float = 4.0, positions: str = "all", at: str = "transformer.h.0") -> dict:
    return {"steer": {"at": at, "type": "forward", "actions": [
        {"name": "modify_output", "op": "add", "value": VECTOR, "dim": -1, "factor": factor, "positions": positions}]}}


def raw_generate(hook=None, at: int = 0, eos: int = EOS, batch_size: int = BATCH, **kwargs) -> list[torch.Tensor]:
    """The new tokens of every prompt: plain model.generate, a raw forward hook where given."""
    model, ds = tiny_gpt2(), Prompts()
    handle = model.transformer.h[at].register_forward_hook(hook) if hook else None
    new = []
    try:
        for start in range(0, len(ds), batch_size):
            batch = default_collate([ds[i] for i in range(start, min(start + batch_size, len(ds)))])
            with torch.no_grad():
                out = model.generate(**batch, max_new_tokens=N_NEW, do_sample=False, pad_token_id=PAD, eos_token_id=eos, **kwargs)
            new.extend(out[:, batch["input_ids"].shape[1]:])
    finally:
        if handle:
            handle.remove()
    return new


def stored(new: list[torch.Tensor], eos: int = EOS) -> np.ndarray:
    """What /samples/generated_ids should hold: the tokens up to and with the first EOS, then -1."""
    out = np.full((len(new), N_NEW), -1)
    for i, row in enumerate(new):
        row = row.tolist()
        n = row.index(eos) + 1 if eos in row else len(row)
        out[i, :n] = row[:n]
    return out


def adder(vec: torch.Tensor, when=lambda out: True):
    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if not when(hidden):
            return None
        hidden = hidden + vec
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
    return hook


def read(path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: f[f"samples/{k}"][:] for k in f["samples"]} | {"status": f.attrs["status"]}


def test_steered_greedy_text_equals_a_raw_hook_and_differs_from_unsteered(tmp_path):
    result = hookrun.run(cfg(tmp_path, steer(4.0)))
    got = read(result.path)
    vec = 4.0 * torch.tensor(VECTOR)
    np.testing.assert_array_equal(got["generated_ids"], stored(raw_generate(adder(vec))))
    plain = stored(raw_generate())
    assert not np.array_equal(got["generated_ids"], plain)
    unsteered = hookrun.run(cfg(tmp_path, name="plain.h5"))
    np.testing.assert_array_equal(read(unsteered.path)["generated_ids"], plain)
    texts = hookrun.open_run(result.path).texts()
    assert [t["index"] for t in texts] == list(range(6))
    assert texts[0]["prompt"] == Prompts().tokenizer.decode(Prompts()[0]["input_ids"][-2:].tolist())
    assert all(t["text"] == Prompts().tokenizer.decode(t["tokens"], skip_special_tokens=True) for t in texts)


@pytest.mark.parametrize("positions", ["prompt", "generated"])
def test_positions_restrict_steering_to_the_prompt_or_the_new_tokens(tmp_path, positions):
    result = hookrun.run(cfg(tmp_path, steer(8.0, positions)))
    in_prompt = (lambda h: h.shape[1] > 1) if positions == "prompt" else (lambda h: h.shape[1] == 1)
    expected = stored(raw_generate(adder(8.0 * torch.tensor(VECTOR), in_prompt)))
    np.testing.assert_array_equal(read(result.path)["generated_ids"], expected)


def test_token_rows_equal_the_raw_hook_at_every_call_and_stop_at_eos(tmp_path):
    # an end-of-sequence token the model really produces early in one sample (not its first new token)
    free = raw_generate(eos=-1)
    k, i = min((k, i) for i, row in enumerate(free) for k in range(1, N_NEW - 1) if row[k] not in row[:k])
    eos = int(free[i][k])
    calls = []
    new = raw_generate(lambda m, a, o: calls.append((o[0] if isinstance(o, tuple) else o).clone()), at=1, eos=eos)
    result = hookrun.run(cfg(tmp_path, {"res": {"at": "transformer.h.1", "type": "forward", "actions": [RECORD]}},
                             generate={"eos_token_id": eos}))
    got = read(result.path)
    np.testing.assert_array_equal(got["generated_ids"], stored(new, eos))
    ds, rows, sample, position = Prompts(), [], [], []
    per_batch = len(calls) // 2
    for b, start in enumerate(range(0, len(ds), BATCH)):
        batch_calls = calls[b * per_batch:(b + 1) * per_batch]
        for i in range(start, min(start + BATCH, len(ds))):
            mask = ds[i]["attention_mask"]
            real = mask.nonzero().flatten()
            prompt_len = len(real)
            rows += [batch_calls[0][i - start, j] for j in real.tolist()]
            position += list(range(prompt_len))
            for k in range(1, len(batch_calls)):  # call k reads new token k-1: a row while no EOS came before or at it
                if eos in new[i][:k].tolist():
                    break
                rows.append(batch_calls[k][i - start, 0])
                position.append(prompt_len + k - 1)
            sample += [i] * (len(position) - len(sample))
    generated_flags = [p >= int(ds[s]["attention_mask"].sum()) for s, p in zip(sample, position, strict=True)]
    with h5py.File(result.path, "r") as f:
        ds_rows = f["captures/res/transformer.h.1/output"]
        assert ds_rows.attrs["rows"] == "tokens"
        np.testing.assert_array_equal(ds_rows[:], torch.stack(rows).numpy())
    np.testing.assert_array_equal(got["token_sample"], sample)
    np.testing.assert_array_equal(got["token_position"], position)
    np.testing.assert_array_equal(got["token_generated"].astype(bool), generated_flags)
    assert got["generated_length"][i] == k + 1 and (got["generated_ids"][i, k + 1:] == -1).all()
    np.testing.assert_array_equal(np.bincount(got["token_sample"]), got["prompt_length"] + got["generated_length"] - 1)


def test_left_padded_prompts_of_different_lengths_generate_as_each_prompt_alone(tmp_path):
    result = hookrun.run(cfg(tmp_path))
    got = read(result.path)
    model, ds = tiny_gpt2(), Prompts()
    assert len(set(got["prompt_length"].tolist())) > 1
    for i in range(len(ds)):
        ids = ds[i]["input_ids"][ds[i]["attention_mask"].bool()][None]
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW,
                                 do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
        np.testing.assert_array_equal(got["generated_ids"][i], stored([out[0, ids.shape[1]:]])[0])


def test_sampling_with_a_seed_is_the_same_on_every_run(tmp_path):
    sampled = {"do_sample": True, "temperature": 1.5, "top_k": 0}
    a = read(hookrun.run(cfg(tmp_path, steer(1.0), "a.h5", sampled)).path)["generated_ids"]
    b = read(hookrun.run(cfg(tmp_path, steer(1.0), "b.h5", sampled)).path)["generated_ids"]
    c = read(hookrun.run(cfg(tmp_path, steer(1.0), "c.h5", sampled, seed=1)).path)["generated_ids"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, stored(raw_generate(adder(torch.tensor(VECTOR)))))  # really sampled, not greedy


class NoGenerate(torch.nn.Module):
    def forward(self, input_ids, attention_mask=None):
        return input_ids.float()


@pytest.mark.parametrize("over, message", [
    ({"model": {"_target_": "test_generate.NoGenerate"}}, r"has no generate\(\) method"),
    ({"early_stop": True}, "early_stop=true does not fit mode=generate"),
    ({"loss": {"_target_": "hookrun.runner.losses.sum_output"}}, "loss is unused"),
    ({"generate": {"max_new_tokens": 4, "no_such_argument": 1}}, r"model.generate refused its arguments \(.*\): .*not used by the model: \['no_such_argument'\]"),
    ({"generate": {"max_new_tokens": 4, "temperature": -1.0, "do_sample": True}}, "model.generate refused its arguments"),
    ({"data": {"dataset": {"_target_": "toy_lm.Prompts", "side": "right"}, "batch_size": BATCH}}, "right-padded"),
    ({"hooks": {"r": {"at": "transformer.h.0", "type": "forward", "actions": ["record"]}}}, "needs rows: token"),
    ({"generate": {"max_new_tokens": 4, "num_beams": 2}, "hooks": {"r": {"at": "transformer.h.0", "type": "forward",
                                                                         "actions": [RECORD]}}}, "num_beams=2 with record"),
    ({"mode": "eval", "hooks": steer(1.0, "generated")}, "positions: generated needs mode=generate"),
    ({"data": {"dataset": {"_target_": "toy_lm.Renamed"}, "batch_size": BATCH, "target": None}},
     r"needs input_ids .* it gives ids, mask: name them with data.inputs=\{input_ids: KEY, attention_mask: KEY\}"),
    ({"generate": {"max_new_tokens": 60}}, r"the prompts' 7 tokens and 60 new ones pass the model's 64 positions; "
                                           r"give generate.max_new_tokens <= 57"),
    # an EOS id the model cannot produce (generation ran on to max_new_tokens; -1 still asks for no EOS), a pad id
    # its embedding cannot read ("IndexError: index out of range in self")
    ({"generate": {"max_new_tokens": 4, "eos_token_id": [EOS, 64]}},
     r"^generate.eos_token_id=\[3, 64\]: 64 is not a token id of GPT2LMHeadModel, whose vocabulary is 0..63; give ids within it"),
    ({"generate": {"max_new_tokens": 4, "eos_token_id": 64}}, r"^generate.eos_token_id=64: 64 is not a token id .*; -1: no end"),
    ({"generate": {"max_new_tokens": 4, "pad_token_id": 70}}, r"^generate.pad_token_id=70: 70 is not a token id .* 0..63"),
])
def test_bad_input_is_refused_before_any_batch(tmp_path, over, message):
    c = cfg(tmp_path)
    c.update(over)
    with pytest.raises(ConfigError, match=message) as info:
        hookrun.run(c)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "captures.h5").exists()


def test_max_new_tokens_over_max_bytes_is_refused(tmp_path):
    hooks = {"res": {"at": "transformer.h.*", "type": "forward", "actions": [RECORD]}}
    # (max_bytes was 40,000: the estimate left out whole chunks and metadata, and the 60 KB file got through)
    small = cfg(tmp_path, hooks, generate={"max_new_tokens": 2}, output={"path": str(tmp_path / "a.h5"), "max_bytes": 100_000})
    assert os.path.getsize(hookrun.run(small).path) <= 100_000  # fits
    big = cfg(tmp_path, hooks, generate={"max_new_tokens": 40}, output={"path": str(tmp_path / "b.h5"), "max_bytes": 100_000})
    with pytest.raises(ConfigError, match="exceeds output.max_bytes"):
        hookrun.run(big)
    assert not (tmp_path / "b.h5").exists()


def test_capture_around_generate_steers_and_records_as_a_raw_hook():
    ds = Prompts()
    batch = default_collate([ds[i] for i in range(4)])
    model = tiny_gpt2()
    hooks = {**steer(4.0), "res": {"at": "transformer.h.1", "type": "forward", "actions": [RECORD]}}
    with hookrun.capture(model, hooks) as cap:
        out = model.generate(**batch, max_new_tokens=N_NEW, do_sample=False, pad_token_id=PAD)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    ref, calls = tiny_gpt2(), []
    ref.transformer.h[0].register_forward_hook(adder(4.0 * torch.tensor(VECTOR)))
    ref.transformer.h[1].register_forward_hook(lambda m, a, o: calls.append((o[0] if isinstance(o, tuple) else o).clone()))
    with torch.no_grad():
        expected_ids = ref.generate(**batch, max_new_tokens=N_NEW, do_sample=False, pad_token_id=PAD)
    torch.testing.assert_close(out, expected_ids, rtol=0, atol=0)
    mask, new = batch["attention_mask"].bool(), expected_ids[:, batch["input_ids"].shape[1]:]
    rows, sample, position = [calls[0][mask]], [mask.nonzero()[:, 0]], [mask.long().cumsum(1)[mask] - 1]
    for k in range(1, len(calls)):  # call k reads new token k-1, for the samples that have not met EOS
        alive = ~(new[:, :k] == EOS).any(1)
        rows.append(calls[k][alive, 0])
        sample.append(alive.nonzero()[:, 0])
        position.append(mask.sum(1)[alive] + k - 1)
    torch.testing.assert_close(cap["res", "transformer.h.1", "output"], torch.cat(rows), rtol=0, atol=0)
    assert torch.equal(cap.tokens["sample"], torch.cat(sample)) and torch.equal(cap.tokens["position"], torch.cat(position))
    assert cap.tokens["generated"].sum() == sum(len(s) for s in sample[1:])


@pytest.mark.slow
def test_shipped_experiment_sweeps_steering_strengths_into_a_table_of_texts(tmp_path):
    import yaml
    from conftest import ROOT, run_cli
    from transformers import GPT2LMHeadModel

    from hookrun.data.text import text

    done = run_cli("-m", "experiment=gpt2_steer_generate", "params.factor=0,4", "data.limit=1",
                   f"hydra.sweep.dir={tmp_path}/sweep", "progress=false")
    assert done.returncode == 0, done.stderr
    sweep = hookrun.open_sweep(tmp_path / "sweep")
    table, texts = sweep.table(stats=()), sweep.texts()
    assert "text" in table.columns and [r["params.factor"] for r in table] == [0, 4]
    assert [(r["job"], r["index"]) for r in texts] == [(j, i) for j in ("0", "1") for i in range(4)]
    exp = yaml.safe_load((ROOT / "conf/experiment/gpt2_steer_generate.yaml").read_text())
    vec = torch.tensor(exp["hooks"]["steer"]["actions"][0]["value"])
    model = GPT2LMHeadModel.from_pretrained(ROOT / "hookrun/models/tiny_lm", attn_implementation="eager").eval()
    ds = text(max_length=24, padding_side="left")
    batch = default_collate([ds[i] for i in range(4)])
    for job, factor in ((0, 0.0), (1, 4.0)):
        handle = model.transformer.h[0].register_forward_hook(adder(factor * vec))
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=2)
        handle.remove()
        new = out[:, batch["input_ids"].shape[1]:]
        run = hookrun.open_run(tmp_path / "sweep" / str(job) / "captures.h5")
        texts = run.texts()
        assert [t["tokens"] for t in texts] == [r[: (r.tolist().index(2) + 1) if 2 in r else None].tolist() for r in new]
        assert table[job]["text"] == texts[0]["text"] == ds.tokenizer.decode(texts[0]["tokens"])
        assert run["resid", "transformer.h.1", "output"].shape == (len(run.file["samples/token_sample"]), 128)
        run.close()


def test_beam_search_with_a_steering_hook_alone_equals_a_raw_hook(tmp_path):
    result = hookrun.run(cfg(tmp_path, steer(2.0), generate={"num_beams": 2}))
    expected = stored(raw_generate(adder(2.0 * torch.tensor(VECTOR)), num_beams=2))
    np.testing.assert_array_equal(read(result.path)["generated_ids"], expected)


def test_another_batch_size_changes_sampled_text_but_not_greedy_text(tmp_path):
    sampled = {"do_sample": True, "temperature": 1.5, "top_k": 0}
    by4 = read(hookrun.run(cfg(tmp_path, name="s4.h5", generate=sampled)).path)["generated_ids"]
    c = cfg(tmp_path, name="s2.h5", generate=sampled)
    c["data"]["batch_size"] = 2
    by2 = read(hookrun.run(c).path)["generated_ids"]
    assert not np.array_equal(by4, by2)  # batches are seeded by (seed, batch number): other batches, other draws
    c = cfg(tmp_path, name="g2.h5")
    c["data"]["batch_size"] = 2
    np.testing.assert_array_equal(read(hookrun.run(c).path)["generated_ids"], stored(raw_generate()))


def test_resume_gives_the_uninterrupted_run_text_and_token_rows(tmp_path):
    from toy_models import STOP_AT

    from hookrun.output.process import Interrupted

    hooks = {"res": {"at": "transformer.h.1", "type": "forward", "actions": [RECORD]},
             "stop": {"at": "transformer.h.0", "type": "forward", "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]},
             **steer(1.0)}
    sampled = {"do_sample": True, "temperature": 1.5, "top_k": 0}
    c = cfg(tmp_path, hooks, "full.h5", sampled)
    c["data"]["batch_size"] = 2
    hookrun.run(c)
    c["output"]["path"] = str(tmp_path / "part.h5")
    STOP_AT[:] = [1]
    with pytest.raises(Interrupted):
        hookrun.run(c)
    with h5py.File(tmp_path / "part.h5") as f:
        assert f.attrs["status"] == "interrupted" and f["samples/index"].shape[0] == 4
    hookrun.run({**c, "resume": True})
    with h5py.File(tmp_path / "full.h5") as a, h5py.File(tmp_path / "part.h5") as b:
        assert b.attrs["status"] == "complete"
        for k in ("generated_ids", "generated_length", "generated_text", "prompt_text", "token_sample", "token_position",
                  "token_generated"):
            np.testing.assert_array_equal(a[f"samples/{k}"][:], b[f"samples/{k}"][:])
        np.testing.assert_array_equal(a["captures/res/transformer.h.1/output"][:], b["captures/res/transformer.h.1/output"][:])


def test_unpadded_prompts_map_every_generated_token_to_its_position(tmp_path):
    """A batch without padding: transformers 5 calls the model with `cache=` (4.x: past_key_values)
    and no attention mask, and each new token's call was read as a fresh prompt: positions restarted
    at 0, no row marked generated, rows re-sorted out of order. Reference: one raw forward hook over
    each prompt followed by its generated tokens, no cache, no hookrun."""
    ds = Prompts(n=4, length=5)
    for item in ds.items:
        item["input_ids"][item["attention_mask"] == 0] = 7  # (every token real: no padding in the batch)
        item["attention_mask"][:] = 1
    result = hookrun.run(cfg(tmp_path, {"res": {"at": "transformer.h.1", "type": "forward", "actions": [RECORD]}},
                             generate={"eos_token_id": -1}), dataset=ds)
    got = read(result.path)
    model, seen = tiny_gpt2(), []
    model.transformer.h[1].register_forward_hook(lambda m, a, o: seen.append((o[0] if isinstance(o, tuple) else o)[0]))
    with h5py.File(result.path, "r") as f:
        rows = f["captures/res/transformer.h.1/output"][:]
    for i in range(len(ds)):
        sequence = torch.cat([ds[i]["input_ids"], torch.as_tensor(got["generated_ids"][i, :N_NEW - 1])])
        with torch.no_grad():
            model(sequence[None])
        mine = got["token_sample"] == i
        np.testing.assert_array_equal(got["token_position"][mine], np.arange(len(sequence)))
        np.testing.assert_array_equal(got["token_generated"][mine].astype(bool), np.arange(len(sequence)) >= 5)
        np.testing.assert_allclose(rows[mine], seen[-1].numpy(), atol=1e-5)


def test_a_nul_or_a_lone_surrogate_in_the_text_is_stored_as_a_visible_mark(tmp_path, monkeypatch):
    """HDF5's strings end at a NUL (h5py: 'VLEN strings do not support embedded NULLs'), so a prompt or
    a sampled byte token holding one failed the run at that batch, and a resume failed there again."""
    import toy_lm

    plain = toy_lm.Letters.decode
    monkeypatch.setattr(toy_lm.Letters, "decode", lambda self, ids, skip_special_tokens=False:
                        "\x00" + plain(self, ids, skip_special_tokens) + "\ud800")
    result = hookrun.run(cfg(tmp_path))
    assert result.status == "complete"
    texts = hookrun.open_run(result.path).texts()
    for t in texts:
        assert t["text"] == "\u2400" + plain(Prompts().tokenizer, t["tokens"], True) + "\ufffd"
        assert t["prompt"].startswith("\u2400") and t["prompt"].endswith("\ufffd")
    np.testing.assert_array_equal(read(result.path)["generated_ids"], stored(raw_generate()))
