"""hookrun.probe interrupted (a notebook's Ctrl-C: SIGINT in the pass) raises KeyboardInterrupt saying
nothing was kept; it raised hookrun's Interrupted, whose line told to resume a temporary file it had
just removed ('/tmp/hookrun_probe_.../probe.h5 is marked interrupted: run the same command with
resume=true'), and which `except Exception` caught. The model is left without a hook, and the next
call's probe equals scikit-learn's Ridge on the features a raw forward hook records."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest

import hookrun

pytest.importorskip("sklearn")
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from test_probe_kind import N, Net, data, recorded  # noqa: E402


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_an_interrupted_probe_is_a_keyboard_interrupt_that_keeps_nothing_and_the_next_call_is_sklearns(
        tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (its own temp folder: other workers' probes make theirs)
    model, ds = Net().eval(), data()
    calls, during = [], []

    def ctrl_c(module, args):
        calls.append(1)
        if len(calls) == 3:
            during.extend(tmp_path.glob("hookrun_probe_*"))  # (the call's folder exists here: the test can fail)
            signal.raise_signal(signal.SIGINT)

    before = set(Path(tempfile.gettempdir()).glob("hookrun_probe_*"))
    assert before == set()
    h = model.register_forward_pre_hook(ctrl_c)
    with pytest.raises(KeyboardInterrupt) as info:
        hookrun.probe(model, ds, batch_size=16, inputs=["x"], at="conv", target="value", method="ridge")
    h.remove()
    text = str(info.value)
    assert "hookrun.probe: interrupted by SIGINT; nothing is kept" in text and "probe.h5" not in text
    assert len(during) == 1 and not during[0].exists() and _hooks(model) == 0  # (the call's folder, removed)

    table = hookrun.probe(model, ds, batch_size=16, inputs=["x"], at="conv", target="value", method="ridge",
                          alpha=2.0, standardize=False, control=False)
    feats = recorded(model, ds, model.conv).mean((2, 3))
    y = np.array([float(d["value"]) for d in ds])
    tr, te = train_test_split(np.arange(N), test_size=0.25, random_state=0)
    ref = Ridge(alpha=2.0).fit(feats[tr], y[tr])
    w, b = table.weights["conv"]
    np.testing.assert_allclose(feats[te] @ w[0] + b[0], ref.predict(feats[te]), rtol=1e-6)
