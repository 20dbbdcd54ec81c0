"""op: probe_steer / probe_ablate (runner/kinds/probe/direction.py, the probe kind's ops): a probe run's weights, read back from its
file with h5py here, steer or ablate the module in a second run. References: the module's output by a
raw PyTorch forward hook on the same weights and inputs, changed by numpy (x + f w/|w|), and the
orthogonal projection's two defining properties (the change lies in the rows' span; the ablated
features are orthogonal to every row, so the mean-pooled features score the bias alone)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("sklearn")  # (test_probe_kind's model; its module imports scikit-learn)
from test_probe_kind import Net  # noqa: E402  (a conv of 6 channels on 2 x 8 x 8, then fc to 5)

N, B = 64, 16


def items(n: int = N) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 2, 8, 8, generator=g)
    three = (x[:, 0].mean((1, 2)) > 0).long() + (x[:, 1].mean((1, 2)) > 0).long()
    return [{"x": x[i], "label": three[i], "sign": (x[i, 0].mean() > 0).long()} for i in range(n)]


def cfg(path, **extra) -> dict:
    return {"data": {"batch_size": B, "inputs": ["x"]}, "device": "cpu", "progress": False,
            "output": {"path": str(path), "overwrite": True}, **extra}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steer")
    model, data = Net().eval(), items()
    for name, target in (("three", "label"), ("two", "sign")):
        hookrun.run(cfg(tmp / f"{name}.h5", probe={"at": ["conv"], "target": target, "pool": "mean", "control": False}),
                    model=model, dataset=data)
    return tmp, model, data


def weight(path) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(path, "r") as f:
        return f["probe/000/weight"][:], f["probe/000/bias"][:]


def raw_conv(model: Net, data: list[dict]) -> np.ndarray:
    out = []
    h = model.conv.register_forward_hook(lambda m, a, o: out.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(torch.stack([d["x"] for d in data]))
    h.remove()
    return out[0]


def modified(tmp, model, data, name, **op) -> np.ndarray:
    hooks = {"s": {"at": "conv", "type": "forward",
                   "actions": [{"name": "modify_output", **op}, {"name": "record", "what": "output"}]}}
    hookrun.run(cfg(tmp / f"{name}.h5", hooks=hooks), model=model, dataset=data)
    with h5py.File(tmp / f"{name}.h5", "r") as f:
        return f["captures/s/conv/output"][:].astype(np.float64)


def test_steer_adds_the_unit_direction_of_the_class(setup):
    tmp, model, data = setup
    w, _ = weight(tmp / "three.h5")
    got = modified(tmp, model, data, "steered", op="probe_steer", probe=str(tmp / "three.h5"), label=2, factor=3.0)
    v = 3.0 * w[2] / np.linalg.norm(w[2])  # the class-2 row (classes 0, 1, 2 in order)
    np.testing.assert_allclose(got, raw_conv(model, data) + v[None, :, None, None], rtol=1e-5, atol=1e-5)


def test_a_binary_probe_steers_to_the_first_class_against_its_row(setup):
    tmp, model, data = setup
    w, _ = weight(tmp / "two.h5")
    assert w.shape == (1, 6)
    got = modified(tmp, model, data, "away", op="probe_steer", probe=str(tmp / "two.h5"), at="conv", label=0,
                   factor=2.0)
    v = -2.0 * w[0] / np.linalg.norm(w[0])
    np.testing.assert_allclose(got, raw_conv(model, data) + v[None, :, None, None], rtol=1e-5, atol=1e-5)


def test_ablate_removes_the_rows_span_and_the_probe_reads_only_its_bias(setup):
    tmp, model, data = setup
    w, b = weight(tmp / "three.h5")
    got = modified(tmp, model, data, "ablated", op="probe_ablate", probe=str(tmp / "three.h5"))
    raw = raw_conv(model, data)
    feats, diff = np.moveaxis(got, 1, -1).reshape(-1, 6), np.moveaxis(raw - got, 1, -1).reshape(-1, 6)
    scale = np.abs(raw).max() * np.abs(w).max()
    assert np.abs(feats @ w.T).max() <= 1e-5 * scale  # orthogonal to every row (float32 storage)
    coef, *_ = np.linalg.lstsq(w.T, diff.T, rcond=None)  # the change is a combination of the rows
    assert np.abs(w.T @ coef - diff.T).max() <= 1e-5 * np.abs(raw).max()
    assert np.abs(diff).max() > 1e-2  # (it did change something)
    pooled = got.mean((2, 3))
    np.testing.assert_allclose(pooled @ w.T + b, np.broadcast_to(b, (N, 3)), atol=1e-5 * scale)


def test_a_four_class_probe_ablates_the_three_directions_its_rows_span(tmp_path):
    """The rows of a 4-class probe sum to zero: they span 3 directions. At C=100 the rounding left in
    the 4th singular value passed the old cut-off (max(shape) x eps x the largest) and a 4th,
    meaningless direction was projected out too. Reference: numpy's SVD of the file's rows, rank by
    a relative tolerance, projected out by a raw forward hook on the same model and inputs."""
    model, data = Net().eval(), items()
    for d in data:  # four classes: the signs of both channels' means
        d["four"] = 2 * (d["x"][0].mean() > 0).long() + (d["x"][1].mean() > 0).long()
    hookrun.run(cfg(tmp_path / "four.h5", probe={"at": ["conv"], "target": "four", "pool": "mean", "control": False,
                                                 "C": 100.0}), model=model, dataset=data)
    w, _ = weight(tmp_path / "four.h5")
    u, s, _ = np.linalg.svd(w.T, full_matrices=False)
    assert w.shape == (4, 6) and s[3] < 1e-10 * s[0] and s[2] > 1e-3 * s[0]  # rank 3
    assert s[3] > s[0] * max(w.shape) * np.finfo(np.float64).eps  # (where the old cut-off kept 4)
    q = torch.from_numpy(u[:, :3])
    h = model.conv.register_forward_hook(
        lambda m, a, o: (o.movedim(1, -1).double() - (o.movedim(1, -1).double() @ q) @ q.T).float().movedim(-1, 1))
    raw = []
    g = model.conv.register_forward_hook(lambda m, a, o: raw.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(torch.stack([d["x"] for d in data]))
    h.remove(), g.remove()
    got = modified(tmp_path, model, data, "ablated4", op="probe_ablate", probe=str(tmp_path / "four.h5"))
    np.testing.assert_allclose(got, raw[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op, message", [
    ({"op": "probe_steer", "label": 2, "at": "fc"}, r"has no probe at 'fc'; it probed conv \(set at:"),
    ({"op": "probe_steer", "label": 7}, r"label 7 is not one of the probe's classes \[0, 1, 2\]"),
    ({"op": "probe_steer"}, r"give label: the class to steer towards, one of \[0, 1, 2\]"),
    ({"op": "probe_ablate", "probe": "missing.h5"}, r"probe 'missing.h5': no file 'missing.h5' \(run the probe first"),
    ({"op": "probe_ablate", "probe": "record"}, r"holds no probes"),
])
def test_bad_probe_ops_are_one_line_before_any_batch(setup, op, message):
    tmp, model, data = setup
    probe = {"missing.h5": str(tmp / "missing.h5"), "record": None}.get(op.get("probe"), str(tmp / "three.h5"))
    if op.get("probe") == "record":
        hookrun.run(cfg(tmp / "plain.h5", hooks={"r": {"at": "fc", "type": "forward", "actions": ["record"]}}), model=model, dataset=data)
        probe = str(tmp / "plain.h5")
    message = message.replace("'missing.h5'", repr(probe))
    seen = []
    h = model.conv.register_forward_hook(lambda *a: seen.append(1))
    try:
        with pytest.raises(ConfigError, match=message):
            modified(tmp, model, data, "bad", **{**op, "probe": probe})
    finally:
        h.remove()
    assert not seen  # before any batch


def test_a_module_of_another_width_is_one_line_before_any_batch_naming_both(setup):
    """(It stopped at the first batch, a failed file left; now one sample's forward before the file opens.)"""
    tmp, model, data = setup
    hooks = {"s": {"at": "fc", "type": "forward",
                   "actions": [{"name": "modify_output", "op": "probe_ablate", "probe": str(tmp / "three.h5"), "at": "conv"}]}}
    with pytest.raises(ConfigError, match=r"the output \(1, 5\) has no axis of the probe's 6 features .*\(dim 1: 5\)"):
        hookrun.run(cfg(tmp / "wide.h5", hooks=hooks), model=model, dataset=data)
    assert not (tmp / "wide.h5").exists()


def test_token_rows_are_steered_along_their_last_axis(tmp_path):
    from toy_lm import Prompts, tiny_gpt2

    model, prompts = tiny_gpt2(0), Prompts(n=24, length=7)
    data = [{**prompts[i], "label": torch.tensor(i % 2)} for i in range(len(prompts))]
    lm = {"data": {"batch_size": 8}, "device": "cpu", "progress": False}
    hookrun.run({**lm, "output": {"path": str(tmp_path / "p.h5")},
                 "probe": {"at": "transformer.ln_f", "target": "label", "pool": "last", "control": False}},
                model=model, dataset=data)
    w, _ = weight(tmp_path / "p.h5")
    hooks = {"s": {"at": "transformer.ln_f", "type": "forward", "actions": [
        {"name": "modify_output", "op": "probe_steer", "probe": str(tmp_path / "p.h5"), "label": 1, "factor": 5.0},
        {"name": "record", "what": "output"}]}}
    hookrun.run({**lm, "output": {"path": str(tmp_path / "s.h5")}, "hooks": hooks}, model=model, dataset=data)
    raw = []
    h = model.transformer.ln_f.register_forward_hook(lambda m, a, o: raw.append(o.detach().double().numpy()))
    with torch.no_grad():
        am = torch.stack([d["attention_mask"] for d in data])  # (left padding: positions as generate() counts them)
        model(input_ids=torch.stack([d["input_ids"] for d in data]), attention_mask=am,
              position_ids=(am.cumsum(1) - 1).clamp(min=0))
    h.remove()
    with h5py.File(tmp_path / "s.h5", "r") as f:
        got = f["captures/s/transformer.ln_f/output"][:].astype(np.float64)
    assert raw[0].shape[-1] == w.shape[1] != raw[0].shape[1]  # (the features are the last axis)
    np.testing.assert_allclose(got, raw[0] + 5.0 * w[0] / np.linalg.norm(w[0]), rtol=1e-5, atol=1e-5)


def test_a_feature_maps_width_is_not_taken_for_the_probes_features(tmp_path):
    """A (B, 3, 8, 6) feature map steered by a probe of 6 features was changed along its width (the last
    axis, which only token rows read as features): the run went on and every later layer moved."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 6, 3, padding=1), torch.nn.Conv2d(6, 3, (1, 3)),
                                torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 6, 5)).eval()
    data = items()
    hookrun.run(cfg(tmp_path / "p.h5", probe={"at": ["0"], "target": "label", "pool": "mean", "control": False}),
                model=model, dataset=data)
    hooks = {"s": {"at": "1", "type": "forward", "actions": [
        {"name": "modify_output", "op": "probe_steer", "probe": str(tmp_path / "p.h5"), "at": "0", "label": 1}]}}
    with pytest.raises(ConfigError, match=r"the output \(1, 3, 8, 6\) has no axis of the probe's 6 features"):
        hookrun.run(cfg(tmp_path / "s.h5", hooks=hooks), model=model, dataset=data)
    assert not (tmp_path / "s.h5").exists()


def test_token_rows_as_long_as_the_features_are_steered_and_ablated_along_the_features(tmp_path):
    """A prompt of exactly d_model tokens: (B, T, D) with T == D stopped the first batch ("both dim 1 and the
    last ... have 32 features"), though a probe reads token rows' last axis. Reference: a raw forward hook on
    the same model changed by numpy (x + f w/|w|; x - Q Q^T x, Q numpy's SVD of the centred rows)."""
    from toy_lm import Prompts, tiny_gpt2

    model = tiny_gpt2(0)
    d = model.config.n_embd
    prompts = Prompts(n=16, length=d)
    data = [{**prompts[i], "label": torch.tensor(i % 3)} for i in range(len(prompts))]
    lm = {"data": {"batch_size": 8}, "device": "cpu", "progress": False}
    hookrun.run({**lm, "output": {"path": str(tmp_path / "p.h5")},
                 "probe": {"at": "transformer.h.1", "target": "label", "pool": "mean", "control": False}},
                model=model, dataset=data)
    w, _ = weight(tmp_path / "p.h5")
    raw = []
    h = model.transformer.h[1].register_forward_hook(lambda m, a, o: raw.append(
        (o[0] if isinstance(o, tuple) else o).detach().double().numpy()))
    with torch.no_grad():
        am = torch.stack([x["attention_mask"] for x in data])  # (left padding: positions as generate() counts them)
        model(input_ids=torch.stack([x["input_ids"] for x in data]), attention_mask=am,
              position_ids=(am.cumsum(1) - 1).clamp(min=0))
    h.remove()
    assert raw[0].shape == (16, d, d) and w.shape == (3, d)
    u, s, _ = np.linalg.svd((w - w.mean(0)).T, full_matrices=False)
    q = u[:, s > 1e-8 * s[0]]
    wants = {"probe_steer": raw[0] + 4.0 * w[1] / np.linalg.norm(w[1]), "probe_ablate": raw[0] - (raw[0] @ q) @ q.T}
    for op, want in wants.items():
        extra = {"label": 1, "factor": 4.0} if op == "probe_steer" else {}
        hooks = {"s": {"at": "transformer.h.1", "type": "forward", "actions": [
            {"name": "modify_output", "op": op, "probe": str(tmp_path / "p.h5"), **extra},
            {"name": "record", "what": "output"}]}}
        hookrun.run({**lm, "output": {"path": str(tmp_path / f"{op}.h5")}, "hooks": hooks}, model=model, dataset=data)
        with h5py.File(tmp_path / f"{op}.h5", "r") as f:
            got = f["captures/s/transformer.h.1/output"][:].astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=op)


class _NHWC(torch.nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 3, 1)


def test_a_channels_last_map_is_steered_along_its_channels_not_its_height(tmp_path):
    """A LayerNorm over a (B, H, W, C) map (a ConvNeXt block's) is probed with its channels, the last axis, as
    features; probe_steer added the direction along dim 1 (the height) where H == C, with no message.
    Reference: a raw forward hook's output plus numpy's x + f w/|w| on the last axis."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 8, 3, padding=1), _NHWC(), torch.nn.LayerNorm(8),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 5)).eval()
    data = items()
    hookrun.run(cfg(tmp_path / "p.h5", probe={"at": ["2"], "target": "label", "pool": "mean", "control": False}),
                model=model, dataset=data)
    w, _ = weight(tmp_path / "p.h5")
    hooks = {"s": {"at": "2", "type": "forward", "actions": [
        {"name": "modify_output", "op": "probe_steer", "probe": str(tmp_path / "p.h5"), "label": 2, "factor": 3.0},
        {"name": "record", "what": "output"}]}}
    hookrun.run(cfg(tmp_path / "s.h5", hooks=hooks), model=model, dataset=data)
    raw = []
    h = model[2].register_forward_hook(lambda m, a, o: raw.append(o.detach().double().numpy()))
    with torch.no_grad():
        model(torch.stack([d["x"] for d in data]))
    h.remove()
    with h5py.File(tmp_path / "s.h5", "r") as f:
        got = f["captures/s/2/output"][:].astype(np.float64)
    assert raw[0].shape == (N, 8, 8, 8) and w.shape == (3, 8)
    np.testing.assert_allclose(got, raw[0] + 3.0 * w[2] / np.linalg.norm(w[2]), rtol=1e-5, atol=1e-5)


def test_a_probe_of_a_constant_target_has_no_direction_to_steer_along(tmp_path):
    """A ridge probe of a constant target has a weight row of zeros (numpy: w == 0): probe_steer divided by its
    norm and wrote NaN into every value of the module's output, and the run ended `complete`. Now one line,
    before any batch."""
    model, data = Net().eval(), items()
    for d in data:
        d["c"] = torch.tensor(1.5)
    hookrun.run(cfg(tmp_path / "c.h5", probe={"at": ["conv"], "target": "c", "method": "ridge", "pool": "mean",
                                              "control": False}), model=model, dataset=data)
    w, _ = weight(tmp_path / "c.h5")
    assert w.shape == (1, 6) and not w.any()
    seen = []
    h = model.conv.register_forward_hook(lambda *a: seen.append(1))
    try:
        with pytest.raises(ConfigError, match=r"^hooks.s: probe_steer '.*c.h5' at conv: its weight row is all zeros, so "
                                              r"it has no direction to steer along \(.*\); probe a target that varies$"):
            modified(tmp_path, model, data, "s", op="probe_steer", probe=str(tmp_path / "c.h5"))
    finally:
        h.remove()
    assert not seen


def test_a_probe_fitted_on_another_model_is_one_line_before_any_batch(setup):
    """A probe of the same width fitted on another network (here Net's conv re-initialised) steered it
    without a word: its directions are another feature space's. The file's model_fingerprint names the
    weights it was fitted on; the run's model has others."""
    tmp, model, data = setup
    other = Net().eval()
    torch.manual_seed(1)
    torch.nn.init.normal_(other.conv[0].weight)
    seen = []
    h = other.conv.register_forward_hook(lambda *a: seen.append(1))
    try:
        with pytest.raises(ConfigError) as err:
            modified(tmp, other, data, "other", op="probe_steer", probe=str(tmp / "three.h5"), label=2)
    finally:
        h.remove()
    line = str(err.value)
    assert "\n" not in line and not seen and not (tmp / "other.h5").exists()
    assert f"probe {str(tmp / 'three.h5')!r} was fitted on another model (test_probe_kind.Net, weights " in line
    assert "than this run's (test_probe_kind.Net, weights " in line and "fit a probe on this model" in line
    assert "any_model: true" in line
    # a transfer meant (a fine-tuned copy): any_model: true steers the other model along the probe's row
    w, _ = weight(tmp / "three.h5")
    got = modified(tmp, other, data, "other", op="probe_steer", probe=str(tmp / "three.h5"), label=2, factor=3.0,
                   any_model=True)
    np.testing.assert_allclose(got, raw_conv(other, data) + (3.0 * w[2] / np.linalg.norm(w[2]))[None, :, None, None],
                               rtol=1e-5, atol=1e-5)


def test_a_probe_steers_a_run_that_also_splices_an_sae(setup, tmp_path):
    """The probe's model check compares the weights as they came, before a splice adds its SAE's (a
    digest taken after it named another model, and the run was refused). Reference: the SAE by hand on a
    raw hook's conv.0 output, along its channels, then the ReLU and x + f w/|w|."""
    from toy_models import standard_sae

    tmp, model, data = setup
    sae = standard_sae(tmp_path, 6, 12, "conv.0", seed=4)
    hooks = {"sp": {"at": "conv.0", "type": "forward",
                    "actions": [{"name": "modify_output", "op": "splice", "path": str(tmp_path)}]},
             "s": {"at": "conv", "type": "forward",
                   "actions": [{"name": "modify_output", "op": "probe_steer", "probe": str(tmp / "three.h5"),
                                "label": 2, "factor": 3.0}, {"name": "record", "what": "output"}]}}
    hookrun.run(cfg(tmp_path / "both.h5", hooks=hooks), model=model, dataset=data)
    with h5py.File(tmp_path / "both.h5", "r") as f:
        got = f["captures/s/conv/output"][:].astype(np.float64)
    with torch.no_grad():
        x = model.conv[0](torch.stack([d["x"] for d in data])).permute(0, 2, 3, 1)  # channels last: the SAE's rows
        f_ = torch.relu((x - sae["b_dec"]) @ sae["W_enc"] + sae["b_enc"])
        ref = torch.relu(f_ @ sae["W_dec"] + sae["b_dec"]).permute(0, 3, 1, 2).double().numpy()
    w, _ = weight(tmp / "three.h5")
    np.testing.assert_allclose(got, ref + (3.0 * w[2] / np.linalg.norm(w[2]))[None, :, None, None], rtol=1e-4, atol=1e-5)
