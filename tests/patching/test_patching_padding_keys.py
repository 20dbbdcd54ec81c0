"""Patching's metric inputs (hunt "patch"): `ce` over padded items leaves the padding out, compared with
a one-cell loop of raw forward hooks on the masked model; a per-item position key that is not one
whole number per item, and patch_grid(which="exact") where nothing is recomputed, are one
ConfigError line before any cell."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from patch_tasks import token_task  # noqa: E402
from toy_lm import tiny_gpt2  # noqa: E402

import hookrun
from hookrun.errors import ConfigError

N, T, V = 4, 8, 50
LENGTHS = (8, 5, 6, 3)
RESID = {"r": {"at": "transformer.h.*", "over": ["position"]}}
MASKED = {"input_ids": "clean", "attention_mask": "attention_mask"}


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(0, "eager", n_embd=32, n_head=4, vocab_size=V)


def padded(side: str):
    g = torch.Generator().manual_seed(5)
    clean, mask = torch.zeros(N, T, dtype=torch.long), torch.zeros(N, T, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        part = slice(T - n, T) if side == "left" else slice(0, n)
        clean[i, part], mask[i, part] = torch.randint(4, V, (n,), generator=g), 1
    corrupt = clean.clone()
    at = [T - n + 1 if side == "left" else 1 for n in LENGTHS]  # the second real token of each item
    corrupt[torch.arange(N), at] = (clean[torch.arange(N), at] + 7) % (V - 4) + 4
    items = [{"clean": clean[i], "corrupt": corrupt[i], "attention_mask": mask[i]} for i in range(N)]
    return clean, corrupt, mask, items


def masked_ce(logits, ids, mask):
    """Each item's mean next-token cross-entropy over the pairs (t, t + 1) of real tokens, then the items' mean."""
    nll = -logits[:, :-1].double().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    keep = mask[:, 1:].bool() & mask[:, :-1].bool()
    return float(np.mean([nll[i][keep[i]].mean().item() for i in range(len(ids))]))


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("method", ["exact", "atp"])
def test_ce_over_padded_items_leaves_the_padding_out(model, side, method):
    clean, corrupt, mask, items = padded(side)
    pos = (mask.cumsum(1) - 1).clamp(min=0)  # (positions from each item's first real token, as generate() counts them)
    with torch.no_grad():
        kept = {}
        hooks = [model.transformer.h[k].register_forward_hook(
            lambda mod, i, o, k=k: kept.__setitem__(k, (o[0] if isinstance(o, tuple) else o).clone())) for k in range(2)]
        model(clean, attention_mask=mask, position_ids=pos)
        for h in hooks:
            h.remove()
        m_clean = masked_ce(model(clean, attention_mask=mask, position_ids=pos).logits, clean, mask)
        m_corrupt = masked_ce(model(corrupt, attention_mask=mask, position_ids=pos).logits, clean, mask)
    g = hookrun.patch_grid(model, items, inputs=MASKED, method=method, metric={"name": "ce"}, sites=RESID)["r"]
    assert g.attrs["metric_clean"] == pytest.approx(m_clean, abs=1e-5)
    assert g.attrs["metric_corrupt"] == pytest.approx(m_corrupt, abs=1e-5)
    if method == "atp":
        return
    ref = np.empty((2, T))
    for k in range(2):
        for p in range(T):
            def patch(mod, i, o, k=k, p=p):
                h = (o[0] if isinstance(o, tuple) else o).clone()
                h[:, p] = kept[k][:, p]
                return (h, *o[1:]) if isinstance(o, tuple) else h
            handle = model.transformer.h[k].register_forward_hook(patch)
            with torch.no_grad():
                ref[k, p] = masked_ce(model(corrupt, attention_mask=mask, position_ids=pos).logits, clean, mask)
            handle.remove()
    np.testing.assert_allclose(g.values, ref, atol=1e-5)


@pytest.mark.parametrize("value, message", [
    (lambda i: torch.tensor(2.5), r"^patching.metric.position='p': item 0 has position 2.5 \(float32\), not a whole number"),
    (lambda i: torch.tensor(True), r"^patching.metric.position='p': item 0 has position True \(bool\), not a whole number"),
    (lambda i: torch.tensor([1, 2]), r"^patching.metric.position='p': expected one position per item, got shape \(3, 2\) for 3 items$"),
])
def test_a_position_key_that_is_not_one_whole_number_per_item_is_one_line(value, message):
    m = tiny_gpt2(0, vocab_size=V)
    *_, items = token_task(V, 3, 6, at=2, low=4)
    items = [dict(it, p=value(i)) for i, it in enumerate(items)]
    for method in ("exact", "atp"):
        with pytest.raises(ConfigError, match=message):
            hookrun.patch_grid(m, items, method=method, metric={"name": "prob", "position": "p"}, sites=RESID)


@pytest.mark.parametrize("metric, key", [({"position": 3}, "position=3"), ({"position": "p"}, "position='p'"),
                                          ({"answer": "target"}, "answer='target'"), ({"wrong": "foil"}, "wrong='foil'")])
def test_a_ce_metric_given_a_key_it_does_not_read_is_one_line_before_any_forward(metric, key):
    """ce is the mean next-token loss over the whole sequence: a position, answer or wrong beside it
    would be ignored (the grid was the whole-sequence ce whatever position said); now refused."""
    m = tiny_gpt2(0, vocab_size=V)
    *_, items = token_task(V, 3, 6, at=2, low=4)
    calls = []
    m.register_forward_hook(lambda *a: calls.append(1))
    name = key.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^patching.metric.{re.escape(key)}: metric ce reads the next token at every "
                                          rf"position and no {name}; drop {name}, or choose logit_diff"):
        hookrun.patch_grid(m, items, metric={"name": "ce", **metric}, sites=RESID)
    assert not calls


def test_a_bool_answer_is_refused():
    m = tiny_gpt2(0, vocab_size=V)
    *_, items = token_task(V, 3, 6, at=2, low=4)
    with pytest.raises(ConfigError, match=r"^patching.metric.answer='answer': the items' 'answer' are not whole numbers"):
        hookrun.patch_grid(m, [dict(it, answer=torch.tensor(True)) for it in items], sites=RESID)


@pytest.mark.parametrize("block, advice", [({"method": "exact"}, "an exact run's grid is which='value'"),
                                           ({"method": "atp"}, "give verify=K")])
def test_which_exact_without_recomputed_cells_is_one_line_before_any_forward(block, advice):
    m = tiny_gpt2(0, vocab_size=V)
    *_, items = token_task(V, 3, 6, at=2, low=4)
    calls = []
    handle = m.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ConfigError, match=r"^patch_grid: which='exact' is the cells an atp run recomputes exactly") as e:
            hookrun.patch_grid(m, items, which="exact", sites=RESID, **block)
    finally:
        handle.remove()
    assert advice in str(e.value) and "\n" not in str(e.value) and not calls


@pytest.mark.parametrize("method", ["exact", "atp"])
@pytest.mark.parametrize("item_mask, real", [([1, 0, 0, 0, 0, 0, 0, 0], 1), ([0] * 8, 0)])
def test_ce_of_an_item_with_fewer_than_two_real_tokens_is_one_line_before_any_forward(model, method, item_mask, real):
    """Its mean over no next-token pair was 0/0: every cell NaN (measured: 16 of 16), after every forward."""
    *_, items = padded("right")
    items[3] = dict(items[3], attention_mask=torch.tensor(item_mask))
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ConfigError, match=rf"^patching.metric.name='ce': item 3 has {real} real token\(s\) \(attention_mask\), "
                                              r"so no next-token pair \(t, t \+ 1\) to measure: its ce would be 0/0 \(NaN\)"):
            hookrun.patch_grid(model, items, inputs=MASKED, method=method, metric={"name": "ce"}, sites=RESID)
    finally:
        handle.remove()
    assert calls == []
    keep = torch.tensor(item_mask).bool()  # the reference: the item's real next-token pairs, counted directly
    assert int((keep[1:] & keep[:-1]).sum()) == 0


@pytest.mark.parametrize("method", ["exact", "atp", "eap"])
def test_a_metric_position_on_padding_is_one_line_and_the_last_real_token_is_read(model, method):
    """Right-padded items with the default position -1: the metric read the model's output at a pad token (item 1 has 5
    real tokens of 8), silently; MIB reads each item's last real token. Now one line naming the first such item (found
    here from the mask directly); a position key of the last real tokens gives the raw masked forward's logit difference."""
    clean, corrupt, mask, items = padded("right")
    items = [dict(it, answer=3, wrong=5, last=n - 1) for it, n in zip(items, LENGTHS, strict=True)]
    first = int((mask[:, -1] == 0).nonzero()[0])  # the reference: the first item whose position -1 is padding
    block = {"method": method, **({} if method == "eap" else {"sites": RESID})}
    with pytest.raises(ConfigError, match=rf"^patching.metric.position=-1: item {first}'s position {T - 1} is padding \(its "
                                          r"'attention_mask' is 0 there\), so the metric would read the model's output at a "
                                          r"pad token; read each item's last real token") as e:
        hookrun.patch_grid(model, items, inputs=MASKED, metric={"name": "logit_diff"}, **block)
    assert "\n" not in str(e.value)
    g = hookrun.patch_grid(model, items, inputs=MASKED, metric={"name": "logit_diff", "position": "last"}, **block)
    with torch.no_grad():
        logits = model(clean, attention_mask=mask).logits[torch.arange(N), torch.tensor(LENGTHS) - 1].double()
    assert next(iter(g.values())).attrs["metric_clean"] == pytest.approx(float((logits[:, 3] - logits[:, 5]).mean()), abs=1e-5)
