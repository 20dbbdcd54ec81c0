"""MIB's faithfulness under `ablation: mean` where m(clean) equals m(empty circuit): the denominator
m_clean - m_empty is zero. It was divided anyway (numpy's RuntimeWarning, NaN or inf in the file, CPR nan in
the log line with no reason; the report drew an empty curve); now each value is NaN and the file's curves, the
run's last line, inspect and the report say why (as clean = corrupted metrics are refused by name).

The items are made so that the reference is exact by symmetry, checked with a raw TransformerLens forward: two
items share one clean prompt and swap answer and wrong token, so m_clean = mean(d, -d) = 0; under mean ablation
the empty circuit gives both items the same inputs (the corrupted runs' mean), so m_empty = 0 too."""

from __future__ import annotations

import json
import warnings

import h5py
import numpy as np
import torch
from tl_models import hooked_transformer

import hookrun
from hookrun.cli.inspect_command import main as inspect_main

V, T = 40, 6


def symmetric_items():
    g = torch.Generator().manual_seed(3)
    clean, b, c = (torch.randint(0, V, (T,), generator=g) for _ in range(3))
    return [{"clean": clean, "corrupt": b, "answer": 3, "wrong": 5},
            {"clean": clean.clone(), "corrupt": c, "answer": 5, "wrong": 3}]


def test_a_zero_denominator_is_nan_with_its_reason(tmp_path, capsys):
    model = hooked_transformer(V, n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=2, act_fn="gelu", seed=1)
    items = symmetric_items()
    with torch.no_grad():
        logits = model(torch.stack([it["clean"] for it in items]))[:, -1].double()
    m_clean = float(((logits[0, 3] - logits[0, 5]) + (logits[1, 5] - logits[1, 3])) / 2)
    assert m_clean == 0.0  # the reference: exactly zero, as m_empty is by the same symmetry

    path = tmp_path / "edges.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (numpy's "invalid value encountered in divide")
        result = hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path)},
                              "patching": {"method": "eap", "input": "input",
                                           "faithfulness": {"fractions": "mib", "ablation": "mean"}}},
                             model=model, dataset=items)
    why = ("m(clean) equals m(empty circuit) (0), so faithfulness (m - m_empty) / (m_clean - m_empty) is undefined (NaN); "
           "choose items the metric separates from the empty circuit")
    assert f"MIB CPR nan, CMD nan: {why}" in result.note

    with h5py.File(path, "r") as f:  # the file, read without hookrun
        mib = json.loads(f.attrs["patching"])["faithfulness"]["mib"]
    assert mib["metric_clean"] == mib["metric_empty"] == 0.0 and mib["undefined"] == why
    for name in ("cpr", "cmd"):
        assert np.isnan(mib[name]["faithfulness"]).all() and np.isnan(mib[name]["area"])

    grid = hookrun.open_run(path).edges()[1]
    assert grid.attrs["faithfulness_undefined"] == why and np.isnan(grid.attrs["faithfulness_cpr_curve"]).all()

    capsys.readouterr()
    assert inspect_main([str(path)]) == 0
    assert f"      undefined: {why}" in capsys.readouterr().out.splitlines()

    from hookrun.analysis.report import run_data

    with hookrun.open_run(path) as run:
        data = run_data(run)
    (grids,) = [s for s in data["sections"] if s["id"] == "grids"]
    (edges,) = [item for item in grids["items"] if item["title"].startswith("edges:")]
    assert edges["title"].endswith(f"; MIB faithfulness: {why}")
    titles = json.dumps([f["figure"].get("layout", {}).get("title") for f in edges["figures"]])
    assert "faithfulness (MIB)" not in titles  # (no curve of nothing)

    # plot draws no curve either, and says so (it skipped it without a word): the reason is the file's, read by h5py
    from hookrun.cli.plot_command import main as plot_main

    assert plot_main([str(path), "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out
    with h5py.File(path, "r") as f:
        source = json.loads(f.attrs["patching"])["faithfulness"]["from"]
    assert f"not drawn: the faithfulness (MIB) curve of {source}: {why}" in out.splitlines(), out
    assert not [p for p in (tmp_path / "figs").iterdir() if "MIB" in p.name or "mib" in p.name]
