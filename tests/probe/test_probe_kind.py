"""probe runs end to end against scikit-learn on features recorded by a raw PyTorch forward hook and
pooled by numpy: logistic (objective by sklearn's own LinearModelLoss, test predictions), ridge on
token rows (coefficients to 1e-6), the split (train_test_split), the refusals before any batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hookrun
from hookrun.errors import ConfigError, HookrunError

pytest.importorskip("sklearn")
from sklearn._loss.loss import HalfMultinomialLoss  # noqa: E402
from sklearn.dummy import DummyClassifier  # noqa: E402
from sklearn.linear_model import LogisticRegression, Ridge  # noqa: E402
from sklearn.linear_model._linear_loss import LinearModelLoss  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from toy_lm import Prompts, tiny_gpt2  # noqa: E402

N, B, CLASSES = 96, 16, 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(6 * 8 * 8, 5)
        self.total = Sum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return self.total(self.fc(h.flatten(1)))


class Sum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x  # (an identity; `lost` below returns (batch,))


def data(n=N, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, 8, 8, generator=g)
    y = ((x[:, 0].mean((1, 2)) > 0).long() + (x[:, 1].mean((1, 2)) > 0).long())  # 3 classes from the input
    return [{"x": x[i], "label": y[i], "value": x[i, 0].mean() * 3 + 1.0} for i in range(n)]


def run(tmp_path, model, dataset, name="p", **block):
    path = tmp_path / f"{name}.h5"
    cfg = {"data": {"batch_size": B, "inputs": ["x"] if "x" in dataset[0] else None}, "device": "cpu",
           "progress": False, "output": {"path": str(path), "overwrite": True}, "probe": block}
    hookrun.run(cfg, model=model, dataset=dataset)
    return hookrun.open_run(path)


def recorded(model, dataset, module, key="x"):
    """The module's outputs over the data, by a raw forward hook (a copy, as the hook sees it), as float64 numpy."""
    out = []
    h = module.register_forward_hook(lambda m, a, o: out.append(o.detach().clone().double()))
    with torch.no_grad():
        for s in range(0, len(dataset), B):
            model(torch.stack([d[key] for d in dataset[s:s + B]]))
    h.remove()
    return torch.cat(out).numpy()


def objective(coef, intercept, x, y, C=0.5):
    """sklearn's own objective for LogisticRegression(C, lbfgs) (multinomial)."""
    loss = LinearModelLoss(HalfMultinomialLoss(n_classes=CLASSES), True)
    return loss.loss(np.concatenate([coef, intercept[:, None]], 1), x, y.astype(float), l2_reg_strength=1 / (C * len(x)))


def test_logistic_run_equals_sklearn_on_hooked_features(tmp_path):
    model, ds = Net().eval(), data()
    run_ = run(tmp_path, model, ds, at=["conv", "fc"], target="label", method="logistic", C=0.5, control=True)
    t = run_.probes()
    assert t.column("at") == ["conv", "fc"] and t.column("rows") == [N, N]
    tr, te = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    y = np.array([int(d["label"]) for d in ds])
    for i, (name, feats) in enumerate((("conv", recorded(model, ds, model.conv).mean((2, 3))),
                                      ("fc", recorded(model, ds, model.fc)))):
        sc = StandardScaler().fit(feats[tr])
        ref = LogisticRegression(C=0.5, tol=1e-10, max_iter=100000).fit(sc.transform(feats[tr]), y[tr])
        w, b = run_.probe_weights(name)
        coef = w * sc.scale_
        intercept = b + w @ sc.mean_
        xs = sc.transform(feats[tr])
        assert objective(coef, intercept, xs, y[tr]) <= objective(ref.coef_, ref.intercept_, xs, y[tr]) * (1 + 1e-6)
        ours = (feats[te] @ w.T + b).argmax(1)
        assert (ours == ref.predict(sc.transform(feats[te]))).mean() >= 0.995
        assert t[i]["test"] == pytest.approx(ref.score(sc.transform(feats[te]), y[te]), abs=0.011)
        assert t[i]["selectivity"] == pytest.approx(t[i]["test"] - t[i]["control"])
        chance = DummyClassifier(strategy="most_frequent").fit(feats[tr], y[tr]).score(feats[te], y[te])
        assert t[i]["majority"] == chance  # (the same rows counted: exactly equal)


def test_ridge_regression_run_equals_sklearn(tmp_path):
    model, ds = Net().eval(), data()
    run_ = run(tmp_path, model, ds, at="conv", target="value", method="ridge", alpha=2.0, pool="max",
               standardize=False, split={"test": 0.3, "seed": 4})
    feats = recorded(model, ds, model.conv).max((2, 3))
    y = np.array([float(d["value"]) for d in ds])
    tr, te = train_test_split(np.arange(N), test_size=0.3, random_state=4)
    ref = Ridge(alpha=2.0).fit(feats[tr], y[tr])
    w, b = run_.probe_weights("conv")
    np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-6, atol=1e-9 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(feats[te] @ w[0] + b[0], ref.predict(feats[te]), rtol=1e-6)
    assert run_.probes()[0]["test"] == pytest.approx(ref.score(feats[te], y[te]), rel=1e-6)
    assert run_.probes()[0]["majority"] is None  # (no classes: no majority class)


class Rectified(nn.Module):
    """conv and linear layers each followed by ReLU(inplace=True): the forward rectifies each output in
    place once its hooks have returned (torchvision's conv -> bn -> ReLU(inplace=True), VGG's features)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.act1 = nn.Conv2d(2, 6, 3, padding=1), nn.ReLU(inplace=True)
        self.lin, self.act2 = nn.Linear(6 * 8 * 8, 5), nn.ReLU(inplace=True)
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act2(self.lin(self.act1(self.conv(x)).flatten(1))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_output_the_forward_changes_in_place_after_its_hook_is_probed_as_the_hook_saw_it(tmp_path, dtype):
    """The probe's rows are the module's output as its forward hook sees it, not what a ReLU(inplace=True)
    after it makes of it (the rows were pooled after the forward: the conv's probe was fitted on
    rectified maps, a float64 linear layer's likewise). Reference: sklearn's Ridge on raw-hook copies."""
    model = Rectified().to(dtype).eval()
    ds = [{**d, "x": d["x"].to(dtype)} for d in data()]
    run_ = run(tmp_path, model, ds, at=["conv", "lin"], target="value", method="ridge", alpha=1.0,
               standardize=False, split={"test": 0.25, "seed": 0})
    y = np.array([float(d["value"]) for d in ds])
    tr, _ = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    for name, feats in (("conv", recorded(model, ds, model.conv).mean((2, 3))), ("lin", recorded(model, ds, model.lin))):
        assert (feats < 0).any(), name  # (the output has negatives; the rectified one has none)
        ref = Ridge(alpha=1.0).fit(feats[tr], y[tr])
        w, _ = run_.probe_weights(name)
        np.testing.assert_allclose(w[0], ref.coef_, rtol=1e-6, atol=1e-9 * np.abs(ref.coef_).max(), err_msg=name)


def parity(batch):
    """A token target: the token id's parity (one per token)."""
    return batch["input_ids"] % 2


@pytest.mark.parametrize("side", ["left", "right"])
def test_token_rows_every_real_token_ridge_equals_sklearn(tmp_path, side):
    model, ds = tiny_gpt2(0), Prompts(n=40, length=7, side=side)
    items = [ds[i] for i in range(len(ds))]
    path = tmp_path / "tok.h5"
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(path)},
           "probe": {"at": "transformer.h.1", "target": {"_target_": "test_probe_kind.parity"}, "method": "ridge",
                     "alpha": 0.5, "pool": "every", "control": True}}
    hookrun.run(cfg, model=model, dataset=ds)
    out = []
    h = model.transformer.h[1].register_forward_hook(lambda m, a, o: out.append((o[0] if isinstance(o, tuple) else o).double()))
    with torch.no_grad():
        am = torch.stack([d["attention_mask"] for d in items])  # (positions from each item's first real token,
        model(input_ids=torch.stack([d["input_ids"] for d in items]), attention_mask=am,  # as generate() counts them)
              position_ids=(am.cumsum(1) - 1).clamp(min=0))
    h.remove()
    mask = torch.stack([d["attention_mask"] for d in items]).bool().numpy()
    ids = torch.stack([d["input_ids"] for d in items]).numpy()
    feats, y = out[0].numpy()[mask], ids[mask] % 2
    item = np.nonzero(mask)[0]
    tr, te = train_test_split(np.arange(40), test_size=0.25, random_state=0)
    train = np.isin(item, tr)
    sc = StandardScaler().fit(feats[train])
    onehot = np.stack([y == 0, y == 1], 1).astype(float)
    ref = Ridge(alpha=0.5).fit(sc.transform(feats[train]), onehot[train])
    run_ = hookrun.open_run(path)
    w, b = run_.probe_weights("transformer.h.1")
    np.testing.assert_allclose(w * sc.scale_, ref.coef_, rtol=1e-6, atol=1e-6 * np.abs(ref.coef_).max())
    t = run_.probes()
    assert t[0]["rows"] == int(mask.sum())
    pred = ref.predict(sc.transform(feats[~train])).argmax(1)
    assert t[0]["test"] == pytest.approx((pred == y[~train]).mean())
    chance = DummyClassifier(strategy="most_frequent").fit(feats[train], y[train]).score(feats[~train], y[~train])
    assert t[0]["majority"] == chance  # token rows: the test items' real tokens


def lost(x):
    return x.sum(1)


@pytest.mark.parametrize("block,message", [
    ({"at": "fc", "target": "lable"}, "probe.target='lable': the items have no key 'lable'; did you mean label?"),
    ({"at": "fc", "target": "value"}, "method=logistic cannot fit"),
    ({"at": "fc", "target": "label", "split": {"test": 1.5}}, "probe.split.test=1.5"),
    ({"at": "fc", "target": "label", "split": 0.3},  # (was OmegaConf's "Merge error: float is not a subclass of Split")
     "probe.split=0.3: a mapping of its keys (test, seed); set one with probe.split.test=..., or give {test: ..., seed: ...}"),
    ({"at": "fc", "target": "label", "split": None}, "probe.split=null: a mapping of its keys"),
    ({"at": "fc", "target": "label", "memory": 100}, "probe.memory=100 bytes: one batch's rows at fc take 640 bytes"),
    # the widest point named first (16 x 6 float64 at conv against 16 x 5 at fc), so the size it gives is enough
    ({"at": ["fc", "conv"], "target": "label", "memory": 1000},
     "probe.memory=1000 bytes: one batch's rows at conv take 768 bytes (float64) and each of the 2 hook point(s) "
     "has 500; give probe.memory at least 1536 bytes"),
    ({"at": "fc", "target": "label", "max_iter": 0}, "probe.max_iter=0: the logistic solver's iterations at most"),
    ({"at": "conv", "target": "label", "pool": "every"}, "probe.pool=every: conv's output (16, 6, 8, 8) is not token rows"),
    ({"at": "fc", "target": "label", "pool": "last"}, "probe.pool=last: fc's output (16, 5) is one row per item (batch, "
                                                      "features), not token rows; it needs no pooling"),
    ({"at": "total", "target": "label"}, "total's output has shape (16,), with no feature axis"),
    ({"at": "fcc", "target": "label"}, "probe.at: Net has no module 'fcc'"),
    ({"at": "fc", "target": "label", "method": "svm"}, "probe.method='svm'; choose logistic or ridge"),
])
def test_bad_input_is_one_line_before_any_batch(tmp_path, block, message):
    model = Net().eval()
    model.total.forward = lost  # (batch,): no feature axis
    with pytest.raises(HookrunError) as err:
        run(tmp_path, model, data(), **block)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "p.h5").exists()


def test_a_logistic_fit_stopped_at_max_iter_says_so(tmp_path, caplog):
    """(sklearn's ConvergenceWarning): the log, inspect's line and run.probes()'s `converged` column;
    the same block with the default cap converges."""
    with caplog.at_level("WARNING", logger="hookrun"):
        stopped = run(tmp_path, Net().eval(), data(), name="s", at=["conv", "fc"], target="label", max_iter=2)
    assert stopped.probes().column("converged") == [False, False]
    assert "probe: the logistic fit at conv stopped after 2 iterations without converging" in caplog.text
    assert "NOT CONVERGED (stopped after 2 iterations: its weights are not the optimum)" in stopped.summary()
    assert run(tmp_path, Net().eval(), data(), at=["conv", "fc"], target="label").probes().column("converged") == [True, True]
    assert run(tmp_path, Net().eval(), data(), name="r", at="fc", target="value", method="ridge").probes().column(
        "converged") == [None]  # a closed form


def test_a_control_fit_stopped_at_max_iter_says_so(tmp_path, caplog):
    """The control task's fit stopped short was reported converged, its control accuracy and selectivity
    taken for the optimum's. Here (C=10, unstandardised) conv's probe needs 57 iterations and its control
    66, fc's 39 and 35: at max_iter=60 only conv's control stops short."""
    with caplog.at_level("WARNING", logger="hookrun"):
        got = run(tmp_path, Net().eval(), data(), name="c", at=["conv", "fc"], target="label", control=True, C=10.0,
                  standardize=False, max_iter=60)
    assert got.probes().column("converged") == [False, True]
    assert "the control task's logistic fit at conv stopped after 60 iterations without converging" in caplog.text
    assert "the logistic fit at" not in caplog.text  # (the probes themselves converged)
    conv = next(line for line in got.summary().splitlines() if line.strip().startswith("conv "))
    assert conv.endswith(", control NOT CONVERGED (stopped after 60 iterations: the control and the selectivity are "
                         "not the optimum's)") and "its weights" not in conv
    from hookrun.runner.kinds.probe.reader import depth_figure

    # the picture says so too (it drew them unmarked)
    assert depth_figure(got.file).title == ("linear probe (logistic) accuracy by depth\n"
                                            "NOT CONVERGED at conv: not the optimum's scores (raise probe.max_iter)")
    assert "CONVERGED" not in depth_figure(run(tmp_path, Net().eval(), data(), at=["conv", "fc"], target="label",
                                                control=True).file).title


def test_a_single_class_is_refused(tmp_path):
    ds = [{**d, "label": torch.tensor(2)} for d in data()]
    with pytest.raises(ConfigError, match=r"the data.s targets hold 1 class"):
        run(tmp_path, Net().eval(), ds, at="fc", target="label")


def test_text_targets_against_the_text_itself():
    """after_space / is_space on data=text's byte tokens, against the characters of the lines."""
    from hookrun.data.text import text
    from hookrun.runner.kinds.probe.targets import after_space, is_space

    ds = text(max_length=24)
    batch = {k: torch.stack([ds[i][k] for i in range(4)]) for k in ("input_ids", "attention_mask")}
    after, space = after_space(batch), is_space(batch)
    for i in range(4):
        n = int(batch["attention_mask"][i].sum())
        chars = [None] + list(ds.texts[i].encode()[: n - 1])  # position 0 is bos
        for p in range(1, n):
            assert int(space[i, p]) == (chars[p] == ord(" "))
            assert int(after[i, p]) == (chars[p - 1] == ord(" "))


def test_a_sweep_whose_jobs_probe_other_hook_points_keeps_each_jobs_names(tmp_path):
    """A sweep over models probes other modules in each job: the sweep's chart puts each job's scores
    at their positions in its `at` (never under another job's names), and the report's table has
    every job's columns (read back with open_run, job by job)."""
    import yaml

    from hookrun.analysis.kind_readers import kind_sweep_figures, kind_sweep_sections

    for num, at in enumerate([["fc"], ["conv", "fc"]]):
        job = tmp_path / "sweep" / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"probe.at=[{','.join(at)}]"]))
        run(job, Net().eval(), data(48), name="captures", at=at, target="label", control=False)
    sweep = hookrun.open_sweep(tmp_path / "sweep")
    ((_, chart),) = kind_sweep_figures(sweep)
    tests = [hookrun.open_run(tmp_path / "sweep" / str(n) / "captures.h5").probes().column("test") for n in (0, 1)]
    assert chart.x == ["1", "2"] and "position" in chart.xlabel
    assert list(chart.series.values()) == [[tests[0][0], None], tests[1]]  # (one line per job, by its overrides)
    (section,) = kind_sweep_sections(sweep)
    table = next(item for item in section["items"] if item["type"] == "table")
    assert {"test@conv", "test@fc"} <= set(table["columns"]), table["columns"]


def test_a_sweeps_chart_marks_a_job_whose_fits_stopped_at_max_iter(tmp_path):
    """A job stopped at probe.max_iter drew its scores as any other job's."""
    import yaml

    from hookrun.analysis.kind_readers import kind_sweep_figures

    for num, cap in enumerate([2, 10000]):
        job = tmp_path / "sweep" / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"probe.max_iter={cap}"]))
        run(job, Net().eval(), data(48), name="captures", at=["conv", "fc"], target="label", max_iter=cap)
    ((_, chart),) = kind_sweep_figures(hookrun.open_sweep(tmp_path / "sweep"))
    assert list(chart.series) == ["probe.max_iter=2 (NOT CONVERGED)", "probe.max_iter=10000"]


def test_a_signal_during_the_fit_after_the_last_batch_leaves_a_complete_run(tmp_path, monkeypatch, sigint_default):
    """A first Ctrl-C or SIGTERM while the probes were fitted did not stop the fit: every probe was written,
    but the file was marked 'interrupted', and the resume it asked for wrote a 'complete' file with no
    probes. Reference: the same run without the signal."""
    import os
    import signal

    from hookrun.runner.kinds.probe import kind as probe_kind

    model, ds = Net().eval(), data()
    want = run(tmp_path, model, ds, "plain", at=["conv", "fc"], target="label").probes()
    fit = probe_kind.fit_point

    sent = []

    def signalled(*args, **kwargs):
        if not sent:  # one signal, as the first fit begins (the loop's handler: a stop after the batch in flight)
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return fit(*args, **kwargs)

    monkeypatch.setattr(probe_kind, "fit_point", signalled)
    got = run(tmp_path, model, ds, "signalled", at=["conv", "fc"], target="label")
    assert got.status == "complete" and got.probes().rows == want.rows
