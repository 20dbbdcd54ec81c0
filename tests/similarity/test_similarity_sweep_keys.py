"""A -m sweep over similarity.measure with a key that one measure reads (`similarity.measure=linear_cka,rbf_cka
similarity.sigma=0.5`, the rbf kernel's width) was refused before any job: "job 0 (similarity.measure=linear_cka):
similarity.sigma=0.5: ... read by measure=rbf_cka only", so the two could not be swept together. Now the sweep's
jobs of the other measure leave the key (a log line says so) and its rbf_cka job reads it; a run or a sweep that
does not vary the measure is still refused. References: linear and rbf CKA written from Kornblith et al.'s
definitions in numpy, on the rows of raw forward hooks on the shipped TinyCNN over the same items."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import torch
from conftest import ROOT
from warm_python import python as warm

from hookrun.data import shapes
from hookrun.models import tiny_cnn

AT = ["block1", "fc"]
ARGS = ["model=tiny_cnn", "data=shapes", "data.dataset.size=24", "data.batch_size=8", "progress=false",
        f"+similarity={{at: [{', '.join(AT)}], pool: mean}}"]


def centred_gram_cka(k: np.ndarray, l_: np.ndarray) -> float:
    n = k.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    hsic = lambda a, b: np.trace(a @ h @ b @ h)  # noqa: E731
    return hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_))


def gram_rbf(x: np.ndarray, sigma: float) -> np.ndarray:  # Kornblith et al.'s gram_rbf (threshold = sigma)
    d = x @ x.T
    sq = -2 * d + np.diag(d)[:, None] + np.diag(d)[None, :]
    return np.exp(-sq / (2 * sigma**2 * np.median(sq)))


def hookrun_cli(tmp_path, *args):
    return warm(["-m", "hookrun", *args, *ARGS], cwd=tmp_path, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_sweep_over_the_measure_gives_sigma_to_its_rbf_job_only(tmp_path):
    done = hookrun_cli(tmp_path, "-m", "similarity.measure=linear_cka,rbf_cka", "similarity.sigma=0.5",
                       "hydra.sweep.dir=sweep")
    assert done.returncode == 0, done.stderr
    assert ("similarity.sigma=0.5: the rbf kernel's width, read by measure=rbf_cka only: not by this job's "
            "measure=linear_cka (a sweep over similarity.measure)") in done.stdout + done.stderr
    model, seen = tiny_cnn().eval(), {}
    for name in AT:
        model.get_submodule(name).register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, []).append(o))
    items = shapes(size=24)
    with torch.no_grad():
        for lo in range(0, 24, 8):
            model(torch.stack([items[i][0] for i in range(lo, lo + 8)]))
    rows = {n: (lambda t: t.flatten(2).mean(-1) if t.dim() > 2 else t)(torch.cat(v)).double().numpy()
            for n, v in seen.items()}  # (pool: mean over a map's positions)
    want = {"linear_cka": centred_gram_cka(rows["block1"] @ rows["block1"].T, rows["fc"] @ rows["fc"].T),
            "rbf_cka": centred_gram_cka(gram_rbf(rows["block1"], 0.5), gram_rbf(rows["fc"], 0.5))}
    for job, (measure, sigma) in (("0", ("linear_cka", 0.8)), ("1", ("rbf_cka", 0.5))):
        with h5py.File(tmp_path / "sweep" / job / "captures.h5") as f:
            meta = json.loads(f.attrs["similarity"])
            matrix = f[f"captures/similarity/__model__/{measure}"][:]
        assert (meta["measure"], meta["sigma"], meta["rows"]) == (measure, sigma, AT)
        np.testing.assert_allclose(matrix[0, 1], want[measure], rtol=1e-6)


def test_a_run_or_a_sweep_that_keeps_the_measure_is_still_refused(tmp_path):
    for extra in ([], ["-m", "seed=0,1", "hydra.sweep.dir=seeds"]):
        done = hookrun_cli(tmp_path, *extra, "similarity.sigma=0.5", "hydra.run.dir=one")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert ("similarity.sigma=0.5: the rbf kernel's width, read by measure=rbf_cka only, not by measure=linear_cka; "
                "remove sigma, or set measure: rbf_cka (a -m sweep over similarity.measure gives it to its rbf_cka "
                "jobs)") in done.stderr, done.stderr
