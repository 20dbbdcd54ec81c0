"""Left-padded items (a tokenizer's padding_side="left") whose attention_mask `data.inputs` does not pass:
the model attended to the padding, so every real token's output moved with it, while the actions pooled
over the mask and counted positions from it as if the model had seen it. A `mean` over the tokens of
the shipped tiny_lm's block 1 was 1.4 off the text run alone, `last` 2.4, without a word (this file's GPT-2: 0.006). Now one line naming
data.inputs and the key to add, before any batch where the first item is padded, at the batch where a
later one is (the file left failed); right padding, which a causal model's real tokens never see, runs.
Reference: the block's output by a raw forward hook with each text run alone, unpadded."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("transformers")
from gpt2_rows import rows_alone, tiny_gpt2_model  # noqa: E402

LENGTHS = [9, 3, 12, 5]  # (12: the longest, no padding)
T = 12


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2_model()


def items(side: str, order=(0, 1, 2, 3)) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    texts = [torch.randint(3, 20, (n,), generator=g) for n in LENGTHS]
    out = []
    for k in order:
        ids, mask = torch.zeros(T, dtype=torch.long), torch.zeros(T, dtype=torch.long)
        at = slice(T - LENGTHS[k], T) if side == "left" else slice(0, LENGTHS[k])
        ids[at], mask[at] = texts[k], 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def cfg(path, inputs) -> dict:
    act = [{"name": "record", "what": "output", "reduce": "mean", "dims": "token"},
           {"name": "record", "what": "output", "select": {"dim": "token", "index": "last"}}]
    return {"data": {"batch_size": 2, "inputs": inputs, "target": None}, "device": "cpu", "progress": False,
            "hooks": {"b": {"at": "h.1", "type": "forward", "actions": act}}, "output": {"path": str(path)}}


def alone(model, data):
    texts = [d["input_ids"][d["attention_mask"].bool()].numpy() for d in data]
    return rows_alone(model, texts, block=1)


def test_left_padding_without_the_mask_is_one_line_before_any_batch(model, tmp_path):
    data = items("left")
    ids, mask = torch.stack([d["input_ids"] for d in data]), torch.stack([d["attention_mask"] for d in data])
    seen = []
    h = model.h[1].register_forward_hook(lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(input_ids=ids, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))  # what the run recorded: no mask
    h.remove()
    ref = alone(model, data)
    off = max(np.abs(seen[0][i][mask[i].bool()].double().numpy().mean(0) - ref[i].mean(0)).max() for i in range(4))
    assert off > 1e-3  # (the padding moves every real token's output; the run's rows agree with a text alone to 1e-5)
    for inputs in ({"input_ids": "input_ids"}, ["input_ids"]):
        with pytest.raises(ConfigError) as err:
            hookrun.run(cfg(tmp_path / "c.h5", inputs), model=model, dataset=data)
        line = str(err.value)
        assert line.startswith(f"data.inputs={inputs!r}: the items' attention_mask is left-padded (the first item "), line
        assert line.endswith("add attention_mask: attention_mask to data.inputs") and "\n" not in line
        assert not (tmp_path / "c.h5").exists()


def test_a_later_left_padded_batch_stops_the_run_failed(model, tmp_path):
    data = items("left", order=(2, 0, 1, 3))  # the first item is the longest: no padding
    with pytest.raises(ConfigError, match=r"left-padded \(a batch starts with padding\)"):
        hookrun.run(cfg(tmp_path / "c.h5", {"input_ids": "input_ids"}), model=model, dataset=data)
    with h5py.File(tmp_path / "c.h5") as f:
        assert f.attrs["status"] != "complete"


@pytest.mark.parametrize("side, inputs", [("left", {"input_ids": "input_ids", "attention_mask": "attention_mask"}),
                                          ("right", {"input_ids": "input_ids"})])
def test_a_mask_the_model_sees_or_right_padding_give_each_text_alone(model, tmp_path, side, inputs):
    data = items(side)
    path = hookrun.run(cfg(tmp_path / "c.h5", inputs), model=model, dataset=data).path
    ref = alone(model, data)
    with h5py.File(path) as f:
        g = f["captures/b/h.1"]
        mean, last = g["output"][:], g["output@1"][:]
    for i in range(4):
        np.testing.assert_allclose(mean[i], ref[i].mean(0), atol=1e-5)
        np.testing.assert_allclose(last[i], ref[i][-1], atol=1e-5)
