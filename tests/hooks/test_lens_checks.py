"""logit_lens's ranges (issue 41 items 2 and 7): a target id outside the vocabulary is refused before
any batch (never clamped into it), ids that mean "no target" are named with ignore_index and masked
(NaN log-probability, rank -1) while the others equal the model's own modules; top_k past the
vocabulary, a norm that is no norm and an unembed that is no unembedding are one line before any
batch, no file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.analysis import open_run
from hookrun.data.text import text
from hookrun.errors import ConfigError, RunError
from hookrun.models import tiny_lm

LENS = {"name": "logit_lens", "norm": "transformer.ln_f", "unembed": "lm_head", "top_k": 3, "target": "labels"}


@pytest.fixture(scope="module")
def model():
    return tiny_lm().eval()


@pytest.fixture(scope="module")
def encoded():
    data = text(files="pydoc_topics", max_length=8, limit=4)
    return data.encoded["input_ids"], data.encoded["attention_mask"]


def items(encoded, labels):
    ids, mask = encoded
    return [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(len(ids))]


def run(tmp_path, model, data, **change):
    cfg = {"hooks": {"lens": {"at": "transformer.h.1", "type": "forward", "actions": [{**LENS, **change}]}},
           "data": {"batch_size": 2, "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}, "target": None},
           "output": {"path": str(tmp_path / "l.h5")}, "device": "cpu", "progress": False}
    return hookrun.run(cfg, model=model, dataset=data)


@pytest.mark.parametrize(("bad", "change", "message"), [
    (9999, {}, r"target='labels': the first item holds id 9999, outside the vocabulary of lm_head \(0..258\)"),
    (-100, {}, r"holds id -100, outside the vocabulary .* is named with ignore_index: -100"),
    (None, {"top_k": 300}, r"top_k=300 is larger than the vocabulary of lm_head \(259 tokens\); give at most 259"),
    (None, {"norm": "transformer.h.3"}, r"norm='transformer.h.3' is a GPT2Block, not a norm .* e.g. .*transformer.ln_f"),
    # an unembed that is no unembedding: a norm (hidden features read as token ids), the input embedding
    # (it reads ids and runs first: the lens paired a batch with the next), a layer of another width
    (None, {"unembed": "transformer.ln_f"}, r"unembed='transformer.ln_f' is a LayerNorm, not an unembedding .*output layer, lm_head"),
    (None, {"unembed": "transformer.wte"}, r"unembed='transformer.wte' is an Embedding, not an unembedding"),
    (None, {"unembed": "transformer.h.0.mlp.c_fc"}, r"unembed='transformer.h.0.mlp.c_fc' gives 512 outputs, but the model's vocabulary has 259 tokens"),
])
def test_out_of_range_is_one_line_before_any_batch(tmp_path, model, encoded, bad, change, message):
    labels = encoded[0].clone()
    if bad is not None:
        labels[0, 2] = bad
    with pytest.raises(ConfigError, match=message):
        run(tmp_path, model, items(encoded, labels), **change)
    assert not list(tmp_path.iterdir())  # no file, no failed file
    assert not any(m._forward_hooks for m in model.modules())


def test_ignore_index_masks_those_positions_and_the_rest_equal_the_models_modules(tmp_path, model, encoded):
    ids, mask = encoded
    labels = ids.clone()
    labels[:, ::3] = -100
    path = run(tmp_path, model, items(encoded, labels), ignore_index=-100).path
    caught = {}
    h = model.transformer.h[1].register_forward_hook(lambda m, a, o: caught.setdefault("x", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        h.remove()
        lp = torch.log_softmax(model.lm_head(model.transformer.ln_f(caught["x"])).double(), -1)
    real = labels != -100
    want = np.full(ids.shape, np.nan)
    want[real.numpy()] = lp.gather(-1, labels.clamp(min=0)[..., None])[..., 0][real].numpy()
    rank = np.where(real.numpy(), (lp > lp.gather(-1, labels.clamp(min=0)[..., None])).sum(-1).numpy(), -1)
    with open_run(path) as r:
        got = r["transformer.h.1", "lens.target_logprob"][:]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(r["transformer.h.1", "lens.target_rank"][:], rank)


def test_a_later_batch_with_an_id_past_the_vocabulary_is_not_clamped(tmp_path, model, encoded):
    labels = encoded[0].clone()
    labels[3, 1] = 9999  # the second batch: the first item is fine
    with pytest.raises(RunError, match=r"batch 1 holds id 9999, outside the vocabulary"):
        run(tmp_path, model, items(encoded, labels))


@pytest.mark.parametrize(("labels", "change", "message"), [
    # a module that is no norm (a GELU, a Dropout: they keep the shape but not norm(3x) = norm(x))
    (None, {"norm": "transformer.h.0.mlp.act"}, r"norm='transformer.h.0.mlp.act' is a NewGELUActivation, not a norm "
                                                r"\(.*same output for 3x as for x.*e.g. .*transformer.ln_f"),
    (None, {"norm": "transformer.drop"}, r"norm='transformer.drop' is a Dropout, not a norm"),
    # a float target (it was truncated to a token id), per position or one per sample
    (lambda ids: ids.float(), {}, r"target='labels': the first item holds a float32 tensor, not token ids; give whole-number"),
    (lambda ids: torch.full((len(ids),), 5.7, dtype=torch.float64), {}, r"the first item holds a float64 tensor, not token ids"),
    # a target of neither one id nor one per token: (1,) per item (a (B, 1) batch), (1, T) per item
    (lambda ids: ids[:, :1], {}, r"target='labels': the first item's target has shape \(1,\), its forward 8 tokens; give a scalar"),
    (lambda ids: ids[:, None], {}, r"target='labels': the first item's target has shape \(1, 8\); give a scalar"),
    # a shift past the tokens: no position would have a target
    (None, {"target_shift": 8}, r"target_shift=8 is past the first item's 8 tokens, so no position would have a target; give 0..7"),
    # a `what` the hooked module does not give
    (None, {"what": "output.1"}, r"transformer.h.1 gives no tensor output.1 in one sample's forward; it gives: output"),
])
def test_inputs_that_are_no_lens_are_one_line_before_any_batch(tmp_path, model, encoded, labels, change, message):
    data = items(encoded, encoded[0].clone() if labels is None else labels(encoded[0]))
    with pytest.raises(ConfigError, match=message):
        run(tmp_path, model, data, **change)
    assert not list(tmp_path.iterdir())  # no file, no failed file
    assert not any(m._forward_hooks for m in model.modules())


def test_a_lens_around_generate_is_refused_in_plain_words(model, encoded):
    ids, mask = encoded
    lens = {k: v for k, v in LENS.items() if k != "target"}
    with pytest.raises(RunError) as err:
        with hookrun.capture(model, {"l": {"at": "transformer.h.*", "type": "forward", "actions": [lens]}}):
            model.generate(input_ids=ids[:2], attention_mask=mask[:2], max_new_tokens=2)
    assert "logit_lens does not run around model.generate" in str(err.value) and "(batch, tokens) differ" not in str(err.value)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_target_missing_from_a_positional_call_says_to_pass_it_as_a_keyword(model, encoded):
    lens = {**LENS, "target": "input_ids", "target_shift": 1}
    with pytest.raises(RunError, match=r"target='input_ids': the model call's keyword arguments hold no "
                       r"tensor 'input_ids', it has none \(the model was called positionally\); pass the target as a "
                       r"keyword: model\(input_ids=ids\)"):
        with hookrun.capture(model, {"l": {"at": "transformer.h.1", "type": "forward", "actions": [lens]}}):
            model(encoded[0][:2])


def test_the_mean_pictures_title_counts_padding_apart_from_positions_without_a_target(tmp_path, model, encoded):
    from hookrun.analysis.report.lens_figures import lens_specs

    ids, mask = encoded
    pad = 3  # columns of padding in every sample, on the left
    ids = torch.cat([torch.zeros(len(ids), pad, dtype=ids.dtype), ids], 1)
    mask = torch.cat([torch.zeros(len(mask), pad, dtype=mask.dtype), mask], 1)
    data = [{"input_ids": ids[i], "attention_mask": mask[i]} for i in range(len(ids))]
    cfg = {"hooks": {"lens": {"at": "transformer.h.1", "type": "forward", "actions": [
               {**LENS, "target": "input_ids", "target_shift": 1}]}},
           "data": {"batch_size": 2, "target": None, "store": ["attention_mask"]},
           "output": {"path": str(tmp_path / "p.h5")}, "device": "cpu", "progress": False}
    path = hookrun.run(cfg, model=model, dataset=data).path
    with open_run(path) as run:
        rank = run.file["captures/lens/transformer.h.1/lens.target_rank"][:]
        titles = {s.title.split(" · ")[1]: s.title for s in lens_specs(run, 0)}
    m = mask.numpy() > 0
    padding = int((~m.any(0)).sum())  # numpy on the inputs: columns with no real token
    no_target = int((m.any(0) & ((rank < 0) | ~m).all(0)).sum())  # real somewhere, a target nowhere
    assert (padding, no_target) == (pad, 1)
    assert titles["KL(final ‖ lens), nats"].endswith(f"; {padding} positions of padding in every sample left out")
    assert titles["target rank, log10(1 + mean rank)"].endswith(
        f"; {padding} positions of padding in every sample and {no_target} position without a target left out "
        f"(the last has no next token)")


def test_a_float64_models_lens_is_computed_in_float64(tmp_path, encoded):
    """A float64 model's lens was cast to float32 before its log_softmax (6e-8 relative off, and the
    file's log-probabilities float32). Reference: the model's own ln_f and lm_head called in float64 on
    a raw forward hook's tensor, torch.log_softmax and the KL to the model's own logits in float64."""
    model = tiny_lm().double().eval()
    ids, mask = encoded
    path = run(tmp_path, model, items(encoded, ids.clone())).path
    caught = {}
    h = model.transformer.h[1].register_forward_hook(lambda m, a, o: caught.setdefault("x", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        final = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits, -1)
        h.remove()
        lp = torch.log_softmax(model.lm_head(model.transformer.ln_f(caught["x"])), -1)
    real = mask.bool().numpy()
    with open_run(path) as r:
        top = r["transformer.h.1", "lens.top_logprobs"][:]
        assert top.dtype == np.float64
        np.testing.assert_allclose(top[real], lp.topk(3, dim=-1).values.numpy()[real], rtol=1e-12, atol=1e-12)
        kl = (final.exp() * (final - lp)).sum(-1).numpy()
        np.testing.assert_allclose(r["transformer.h.1", "lens.kl_to_final"][:][real], kl[real], rtol=1e-10, atol=1e-12)
