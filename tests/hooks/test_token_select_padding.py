"""A selection on the token dim, then `reduce` over tokens or `index: last`, leaves padding out:
the attention mask is selected with the tokens. Reference: a raw forward hook on tiny_lm over the
same batches, reduced with numpy over each sample's real tokens (the mask sliced by hand).
(The mask was dropped once a selection changed the token count: padding entered means and maxes,
and `last` took the window's last position, padding or not.)"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.data.text import text
from hookrun.errors import RunError
from hookrun.models.tiny_lm import tiny_lm

AT = "transformer.h.1"
WINDOW, PICK = "0:20", [3, 20]
HOOKS = {
    "mean": [{"dim": "token", "index": WINDOW}], "last": [{"dim": "token", "index": WINDOW}, {"dim": "token", "index": "last"}],
    "max": [{"dim": "token", "index": PICK}],
}


@pytest.fixture(scope="module")
def lm():
    return tiny_lm().eval()


def data(side: str):
    return text(files="pydoc_topics", max_length=24, limit=6, padding_side=side)


def cfg(tmp_path, hooks: dict) -> dict:
    return {"data": {"batch_size": 3}, "device": "cpu", "progress": False, "hooks": hooks,
            "output": {"path": str(tmp_path / "run.h5")}}


def record(name: str, select: list) -> dict:
    reduce = {"mean": {"reduce": "mean", "dims": "token"}, "max": {"reduce": "max", "dims": "token"}}.get(name, {})
    return {"at": AT, "type": "forward", "actions": [{"name": "record", "what": "output", "select": select, **reduce}]}


def raw(lm, ds) -> tuple[np.ndarray, np.ndarray]:
    """The block's output by a raw forward hook on each sample alone, its real tokens only (no padding, so
    no position to count), laid at its mask's places (zeros at the padding), and the masks. (A left-padded
    batch called as model(**batch) counted GPT-2's positions from the padding: runner/token_inputs.with_positions.)"""
    ids = torch.stack([ds[i]["input_ids"] for i in range(len(ds))])
    am = torch.stack([ds[i]["attention_mask"] for i in range(len(ds))]).bool()
    seen = []
    handle = lm.get_submodule(AT).register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            for i in range(len(ds)):
                lm(input_ids=ids[i][am[i]][None])
    finally:
        handle.remove()
    out = np.zeros((*ids.shape, seen[0].shape[-1]), np.float32)
    for i, h in enumerate(seen):
        out[i][am[i].numpy()] = h[0].numpy()
    return out, am.numpy()


@pytest.mark.parametrize("side", ["right", "left"])
def test_token_selection_then_reduce_or_last_leaves_padding_out(tmp_path, lm, side):
    ds = data(side)
    h, am = raw(lm, ds)
    assert len(set(am.sum(1).tolist())) > 1 and not am[:, 0:20].all()  # padding inside the window
    path = hookrun.run(cfg(tmp_path, {k: record(k, v) for k, v in HOOKS.items()}), model=lm, dataset=ds).path
    win, mwin = h[:, 0:20], am[:, 0:20]
    pick, mpick = h[:, PICK], am[:, PICK]
    want = {
        "mean": np.stack([win[i][mwin[i]].mean(0) for i in range(len(h))]),
        "last": np.stack([win[i][np.flatnonzero(mwin[i])[-1]] for i in range(len(h))]),
        "max": np.stack([pick[i][mpick[i]].max(0) for i in range(len(h))]),
    }
    with h5py.File(path, "r") as f:
        for name, value in want.items():
            np.testing.assert_allclose(f[f"captures/{name}/{AT}/output"][:], value, rtol=1e-5, atol=1e-5, err_msg=name)
    if side == "right":  # the window's last position is padding for a short sample: `last` must not take it
        assert not mwin[:, -1].all()


def test_a_selection_with_no_real_token_of_a_sample_is_refused(tmp_path, lm):
    ds = data("left")
    assert not ds[3]["attention_mask"][:2].any()  # its first two tokens are padding
    hooks = {"m": record("mean", [{"dim": "token", "index": "0:2"}])}
    with pytest.raises(RunError, match=r"select token 0:2 holds no real token of sample\(s\) \[3\] \(all padding\) in batch 1, "
                                       r"so mean has no value"):
        hookrun.run(cfg(tmp_path, hooks), model=lm, dataset=ds)
