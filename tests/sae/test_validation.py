"""Bad values of actions' and ops' parameters, refused (or read right) before any batch (issue 34:
items 1, 2, 3): booleans given as strings, feature ids outside an SAE's latents, an SAE with
non-finite weights, and metrics that come out non-finite. References: raw forward hooks computing
the SAE's reconstruction from the saved tensors (test_splice's helpers), the clean model's logits."""

from __future__ import annotations

import json
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")
import test_splice as ts  # noqa: E402  (its tiny GPT-2, SAE folder and raw-hook references)
from test_splice import BLOCK, D_SAE, D, decode, encode, gpt2, logits_with, run  # noqa: E402

data, sae = ts.data, ts.sae  # its fixtures: padded text rows, an SAELens folder and its weights


def captured_logits(model, ds, hooks):
    ids, mask = ds.encoded["input_ids"][:4], ds.encoded["attention_mask"][:4]
    with hookrun.capture(model, {**hooks, "l": {"at": "lm_head", "type": "forward", "actions": ["record"]}}) as cap, \
            torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    return cap["lm_head", "output"]


def splice(folder, **extra):
    return {"s": {"at": BLOCK, "type": "forward", "actions": [{"name": "modify_output", "op": "splice",
                                                               "path": str(folder), **extra}]}}


# -- 1. booleans -------------------------------------------------------------------------------------
@pytest.mark.parametrize("given", ["false", "False", "no", "off"])
def test_error_term_false_as_a_string_splices_without_the_error_term(data, sae, given):
    folder, w = sae
    model = gpt2()
    ref = logits_with(model, data, lambda x: decode(w, encode(w, x)))[0]  # the reconstruction replaces the output
    torch.testing.assert_close(captured_logits(model, data, splice(folder, error_term=given)), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("given", ["true", "yes", "ON"])
def test_error_term_true_as_a_string_keeps_the_clean_output(data, sae, given):
    folder, _ = sae
    model = gpt2()
    clean = logits_with(model, data)[0]
    torch.testing.assert_close(captured_logits(model, data, splice(folder, error_term=given)), clean, rtol=0, atol=0)


def test_a_boolean_parameter_that_is_no_boolean_is_refused_naming_the_key(tmp_path, data, sae):
    folder, _ = sae
    with pytest.raises(ConfigError, match=r"hooks\.s\.actions\.0: error_term='maybe' is not a boolean; give true or false"):
        run(tmp_path, gpt2(), data, splice(folder, error_term="maybe"))
    hooks = {"r": {"at": BLOCK, "type": "forward", "actions": [{"name": "record", "check_finite": "sometimes"}]}}
    with pytest.raises(ConfigError, match=r"hooks\.r\.actions\.0: check_finite='sometimes' is not a boolean"):
        run(tmp_path, gpt2(), data, hooks)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(("op", "params", "message"), [
    ("clamp", {"min": "abc"}, "min='abc' is not a number or null; give e.g. min: 0.5"),
    ("scale", {"factor": "abc"}, "factor='abc' is not a number; give e.g. factor: 0.5"),
    ("noise", {"std": [1, 2]}, "std=[1, 2] is not a number; give e.g. std: 0.5"),
    ("mask", {"index": "abc"}, "index='abc' is not an integer or a list of integers; give e.g. index: 1"),
    ("mask", {"index": [1, 2.5]}, "index=[1, 2.5] is not an integer or a list of integers"),
    ("add", {"value": [1, "x"]}, "value=[1, 'x'] is not a number or a list of numbers"),
])
def test_an_ops_number_that_is_no_number_is_refused_before_any_batch(tmp_path, data, op, params, message):
    """(torch's own error at the first batch before, with a file left marked failed)"""
    hooks = {"s": {"at": BLOCK, "type": "forward", "actions": [{"name": "modify_output", "op": op, **params}]}}
    with pytest.raises(ConfigError) as caught:
        run(tmp_path, gpt2(), data, hooks)
    assert str(caught.value).startswith(f"hooks.s.actions.0: {message}"), str(caught.value)
    assert "\n" not in str(caught.value) and not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(("fn", "given", "read"), [("scale", {"factor": "0.5"}, {"factor": 0.5}),
                                                   ("clamp", {"min": 0, "max": None}, {"min": 0, "max": None}),
                                                   ("mask", {"index": 2.0, "dim": "1"}, {"index": 2, "dim": 1}),
                                                   ("mask", {"index": [1, 3]}, {"index": [1, 3]}),
                                                   ("add", {"value": [0.5, 1], "factor": 2}, {"value": [0.5, 1], "factor": 2})])
def test_typed_params_reads_numbers_as_numbers(fn, given, read):
    from hookrun.config.build import typed_params
    from hookrun.hooks import ops

    got = typed_params(getattr(ops, fn), given, "w")
    assert got == read and [type(v) for v in got.values()] == [type(v) for v in read.values()]


def test_typed_params_passes_a_tensor_or_an_array_given_in_python_as_it_is():
    """(a steering vector as a tensor, a factor as a numpy scalar: what no config holds, the op takes)"""
    import numpy as np

    from hookrun.config.build import typed_params
    from hookrun.hooks import ops

    vector, array = torch.ones(3), np.ones(3)
    assert typed_params(ops.add, {"value": vector}, "w")["value"] is vector
    assert typed_params(ops.add, {"value": array}, "w")["value"] is array
    assert typed_params(ops.scale, {"factor": np.float32(0.5)}, "w") == {"factor": 0.5}
    assert typed_params(ops.mask, {"index": np.int64(3)}, "w") == {"index": 3}


@pytest.mark.parametrize(("given", "read"), [(True, True), (False, False), ("TRUE", True), (" no ", False), (1, True),
                                             (0, False), (None, None)])
def test_typed_params_reads_booleans_as_the_schema_does(given, read):
    from hookrun.config.build import typed_params
    from hookrun.hooks.splice import splice

    got = typed_params(splice, {"error_term": given, "path": "x"}, "w")
    assert got == {"error_term": read, "path": "x"} and type(got["error_term"]) is type(read)


@pytest.mark.parametrize("given", ["maybe", 2, 0.0, [True]])
def test_typed_params_refuses_what_is_no_boolean(given):
    from hookrun.config.build import typed_params
    from hookrun.hooks.splice import splice

    with pytest.raises(ConfigError, match=r"^w: error_term=.* is not a boolean; give true or false$"):
        typed_params(splice, {"error_term": given}, "w")


def test_check_finite_false_as_a_string_does_not_stop_at_an_inf(data):
    """check_finite: 'false' read as false: the inf the op puts in is recorded, not refused."""
    model = gpt2()
    ids = data.encoded["input_ids"][:2]
    hooks = {"inf": {"at": BLOCK, "type": "forward", "actions": [{"name": "modify_output", "op": "constant", "value": float("inf")},
                                                                 {"name": "record", "check_finite": "false"}]}}
    with hookrun.capture(model, hooks) as cap, torch.no_grad():
        model(input_ids=ids)
    assert torch.isinf(cap[BLOCK, "output"]).all()


# -- 2. feature ids ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("features", "message"), [
    ({-1: 5.0}, r"feature -1 is negative; feature indices count from 0"),
    ({D_SAE: 1.0}, rf"feature {D_SAE} does not exist; the SAE has d_sae={D_SAE} features \(0 to {D_SAE - 1}\)"),
    ({3: 1.0, D_SAE + 7: 1.0}, rf"feature {D_SAE + 7} does not exist"),
])
def test_feature_ids_outside_the_saes_latents_are_refused_before_any_batch(tmp_path, data, sae, features, message):
    folder, _ = sae
    hooks = {**splice(folder), "steer": {"at": f"{BLOCK}.sae.latents", "type": "forward",
                                         "actions": [{"name": "modify_output", "op": "add_features", "features": features}]}}
    with pytest.raises(ConfigError, match=message):
        run(tmp_path, gpt2(), data, hooks)
    assert not list(tmp_path.iterdir())  # no file, no `failed` file


def test_zero_features_refuses_a_negative_id_on_any_module(tmp_path, data):
    hooks = {"z": {"at": BLOCK, "type": "forward", "actions": [{"name": "modify_output", "op": "zero_features", "features": [0, -2]}]}}
    with pytest.raises(ConfigError, match=r"op zero_features: feature -2 is negative"):
        run(tmp_path, gpt2(), data, hooks)


# -- 3. non-finite weights and metrics ----------------------------------------------------------------
def write_sae(folder, w):
    folder.mkdir()
    safetensors.save_file(w, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": D, "d_sae": D_SAE, "dtype": "float32",
                                                 "apply_b_dec_to_input": True, "normalize_activations": "none"}))
    return folder


@pytest.mark.parametrize(("tensor", "value", "kind"), [("W_dec", float("nan"), "NaN"), ("b_enc", float("inf"), "inf")])
def test_an_sae_with_non_finite_weights_is_refused_naming_the_tensor(tmp_path, data, sae, tensor, value, kind):
    _, w = sae
    w = {k: v.clone() for k, v in w.items()}
    w[tensor].view(-1)[:3] = value
    folder = write_sae(tmp_path / "bad", w)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError, match=rf"the SAE in .*bad: its tensor {tensor} holds 3 non-finite value\(s\) \({kind}\)"):
        run(out, gpt2(), data, splice(folder))
    assert not list(out.iterdir())


def evaluate(tmp_path, model, ds, hooks):
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "hooks": hooks,
           "loss": {"_target_": "hookrun.runner.losses.lm", "_partial_": True}, "evaluate": {"enabled": True},
           "output": {"path": str(tmp_path / "e.h5"), "overwrite": True}}
    return hookrun.run(cfg, model=model, dataset=ds)


def test_a_non_finite_metric_is_named_with_its_likely_cause(tmp_path, data, sae, caplog):
    _, w = sae
    w = {k: v.clone() for k, v in w.items()}
    w["W_enc"] *= 1e30  # finite weights whose latents and reconstruction overflow (inf - inf: NaN)
    w["W_dec"] *= 1e30
    folder = write_sae(tmp_path / "huge", w)
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        evaluate(tmp_path, gpt2(), data, splice(folder))
    text = caplog.text
    assert "evaluate: mse of the splice at transformer.h.0 is inf" in text
    assert "explained_variance of the splice at transformer.h.0 is -inf" in text
    assert "the SAE's reconstruction is not finite" in text
    assert "evaluate: ce_intervened is nan" in text and "an op or a splice put NaN/inf into the model" in text
    assert text.count("evaluate: mse of the splice") == 1  # once per metric, not once per batch


def test_finite_metrics_warn_nothing(tmp_path, data, sae, caplog):
    folder, _ = sae
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        evaluate(tmp_path, gpt2(), data, splice(folder))
    assert "evaluate:" not in caplog.text
