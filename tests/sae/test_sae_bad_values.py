"""Bad `sae:` values and SAE paths, refused in one line (exit 2) before any training: an object-store
URL as sae.out (was a local folder named 's3:', silently) or as an SAE folder to read (was 'no SAE
folder s3:/...'), a number that is none (was int()'s traceback), a negative loss coefficient, an
infinite lr, a negative JumpReLU bandwidth or threshold, lp_norm 0 (were trained on). And a loader's iterator still open at interpreter exit ends without a traceback.
References: the files on disk (os.walk), the child process' own exit code and stderr, and for
`file://` the SAE's latents from its saved tensors (test_splice's encode)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import ENV
from test_sae_kind import config
from test_sae_train import CAPTURE, make_cache
from warm_python import python as warm

import hookrun
from hookrun.errors import ConfigError, HookrunError

pytest.importorskip("sae_lens")
import test_splice as ts  # noqa: E402  (its SAELens folder with random weights, and encode())

sae = ts.sae  # its fixture: (folder, weights)
URL = "s3://acts/saes/x"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return make_cache(tmp_path_factory.mktemp("bad_values_cache"))


def files(folder: Path) -> list[str]:
    return sorted(str(Path(d, f).relative_to(folder)) for d, _, fs in os.walk(folder) for f in fs)


def refused(cache: str, tmp_path: Path, monkeypatch, **sae) -> str:
    """The run's ConfigError, run from an empty folder: one line, exit code 2, nothing written anywhere."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(ConfigError) as info:
        hookrun.run(config(cache, work / "run", **sae))
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert files(work) == [] and not (work / "s3:").exists()  # no run file, no SAE, no local 's3:' folder
    return str(info.value)


def test_a_url_as_sae_out_is_refused_before_training(cache, tmp_path, monkeypatch):
    msg = refused(cache, tmp_path, monkeypatch, out=URL)
    assert msg == (f"sae.out: {URL!r} is a URL; the SAE folder is written to local disk only: give a local folder "
                   "(e.g. sae.out=saes/h3) and copy it up after the run")


@pytest.mark.parametrize(("sae", "message"), [
    ({"shuffle": {"seed": "abc"}}, "sae.shuffle.seed: 'abc' is not a whole number; give a whole number (the shuffle's seed)"),
    ({"shuffle": {"seed": True}}, "sae.shuffle.seed: True is not a whole number"),
    ({"shuffle": {"buffer_rows": "x"}}, "sae.shuffle.buffer_rows: 'x' is not a whole number; give a whole number of rows"),
    ({"lr_schedule": {"warmup": "x"}}, "sae.lr_schedule.warmup: 'x' is not a whole number; give a whole number of steps"),
    ({"lr_schedule": {"warmup": 1.5}}, "sae.lr_schedule.warmup: 1.5 is not a whole number"),  # (was cut to 1)
    ({"lr_schedule": {"decay": "x"}}, "sae.lr_schedule.decay: 'x' is not a number; give a fraction of the steps in [0, 1)"),
    ({"lr_schedule": {"scheduler": "cosineannealing", "end": "x"}}, "sae.lr_schedule.end: 'x' is not a number"),
    ({"architecture": "matryoshka_batchtopk", "matryoshka_widths": ["a", 64]},
     "sae.matryoshka_widths: 'a' is not a whole number; give whole numbers of latents"),
    ({"architecture": "standard", "k": None, "l1_coefficient": -3.0},
     "sae.l1_coefficient: -3.0 is negative, which rewards what the loss term penalises; give 0 or more"),
    # (these four were trained on: lr inf wrote an SAE of NaN weights as complete; a negative bandwidth turned
    # SAELens' rectangle gradient, (1 / bw) rect((x - t) / bw), against the threshold; a negative threshold let
    # negative latents through; lp_norm 0 made the penalty the nonzero count, whose gradient is 0)
    ({"shuffle": {"seed": -1}}, "sae.shuffle.seed: must be 0 or more (numpy's seed), got -1"),  # (was numpy's
    # ValueError traceback at the first batch, a failed run file left)
    ({"lr_schedule": 5}, "sae.lr_schedule: 5; give {warmup: steps, decay: fraction, scheduler, end} or null"),
    ({"lr": float("inf")}, "sae.lr: must be a finite number above 0, got inf"),
    ({"lr": float("nan")}, "sae.lr: must be a finite number above 0, got nan"),  # (was a line about lr_schedule.end)
    ({"architecture": "standard", "k": None, "l1_coefficient": float("inf")},
     "sae.l1_coefficient: inf is not a finite number; give a finite one"),
    ({"architecture": "jumprelu", "k": None, "jumprelu_bandwidth": -0.05},
     "sae.jumprelu_bandwidth: -0.05; it is the width of the threshold's straight-through gradient (below 0 it "
     "points the wrong way): give a number above 0"),
    ({"architecture": "jumprelu", "k": None, "jumprelu_init_threshold": -1.0},
     "sae.jumprelu_init_threshold: -1.0; it is the threshold a latent must pass (below 0 negative pre-activations "
     "pass): give 0 or more"),
    ({"architecture": "standard", "k": None, "lp_norm": 0.0},
     "sae.lp_norm: 0.0; it is the sparsity penalty's p (0 counts nonzero latents: no gradient): give a number above 0"),
    ({"decoder_init_norm": -0.1},
     "sae.decoder_init_norm: -0.1; it is the decoder rows' starting norm (null: SAELens' own init): give a number "
     "above 0"),
])
def test_a_bad_number_is_one_line_before_training(cache, tmp_path, monkeypatch, sae, message):
    assert refused(cache, tmp_path, monkeypatch, **sae).startswith(message)


def test_the_cli_refuses_a_url_as_sae_out_and_a_bad_seed_with_exit_2(cache, tmp_path):
    for given, line in [(f"sae.out={URL}", f"sae.out: {URL!r} is a URL"),
                        ("sae.shuffle.seed=abc", "sae.shuffle.seed: 'abc' is not a whole number")]:
        work = tmp_path / given.split("=")[0]
        work.mkdir()
        proc = warm(["-m", "hookrun", "experiment=sae_train", f"sae.from={cache}",
                     f"sae.capture={CAPTURE}", "sae.d_sae=64", "sae.k=8", "sae.rows=640", "sae.batch_rows=32",
                     "sae.lr_schedule.warmup=2", "sae.checkpoints=0", given, f"hydra.run.dir={work / 'run'}",
                     "progress=false"], cwd=work, env={**os.environ, **ENV})
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(f"hookrun: error: {line}"), proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert not (work / "s3:").exists() and not (work / "run" / "captures.h5").exists()


def test_load_sae_refuses_a_url_in_one_line_and_reads_file_urls(sae, tmp_path, monkeypatch):
    from hookrun.sae import load_sae

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:" / "acts" / "saes" / "x").mkdir(parents=True)  # (what sae.out=s3://... used to leave)
    with pytest.raises(ConfigError) as info:
        load_sae(URL, where="op splice")
    assert str(info.value) == (f"op splice: {URL!r} is a URL; SAE folders are read from local disk only: copy the "
                               "folder down and give its local path")
    folder, w = sae
    x = torch.randn(5, ts.D, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(load_sae(f"file://{folder}").encode(x), ts.encode(w, x), rtol=1e-5, atol=1e-6)


def test_a_splice_of_a_url_is_refused_before_any_batch(tmp_path, monkeypatch):
    """(experiment=sae_eval params.sae=s3://...: the splice's path)"""
    monkeypatch.chdir(tmp_path)
    cfg = {**config("unused", tmp_path / "run"),
           "hooks": {"s": {"at": "0", "type": "forward",
                           "actions": [{"name": "modify_output", "op": "splice", "path": URL}]}}}
    del cfg["sae"]
    with pytest.raises(ConfigError, match=r"is a URL; SAE folders are read from local disk only"):
        hookrun.run(cfg)
    assert files(tmp_path) == []


def test_a_loader_iterator_open_at_exit_ends_quietly(cache):
    """A training loop's data iterator kept to the end of the process (was: 'Exception ignored in:
    <generator object RowLoader.__iter__>' ... AttributeError, os already gone)."""
    code = (f"import hookrun\nrows = hookrun.open_run({cache!r}).loader({CAPTURE!r}, batch_size=32, seed=0)\n"
            "it = iter(rows)\nprint(tuple(next(it).shape))\n")
    proc = warm(["-c", code], env={**os.environ, **ENV})
    assert proc.returncode == 0 and proc.stdout.strip() == "(32, 16)", proc.stderr[-2000:]
    assert proc.stderr == ""


class Loud(torch.nn.Module):
    """A Linear whose feature 3's weights are scaled by 1e6: values float16 stores as inf (past 65504)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 16)
        with torch.no_grad():
            self.lin.weight[3] *= 1e6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def loud_cache(path: Path, dtype: str, model: torch.nn.Module | None = None) -> Path:
    """A cache of Loud's output (feature 3 past float16's 65504), recorded in `dtype`."""
    data = {"_target_": "hookrun.data.RandomTensors", "n": 400, "shape": [8], "num_classes": 2, "seed": 3}
    hookrun.run({"data": {"dataset": data, "batch_size": 50}, "device": "cpu", "progress": False,
                 "output": {"path": str(path)}, "hooks": {"mlp": {"at": "lin", "type": "forward", "actions": [
                     {"name": "record", "what": "output", "dtype": dtype}]}}}, model=model or Loud())
    return path


def test_a_float16_cache_holding_inf_is_refused_before_the_model_not_trained_into_a_nan_sae(tmp_path, monkeypatch):
    """A cache recorded with dtype: float16 whose values overflowed holds inf, and its overflow_values
    attribute says how many. Trained on, it gave an SAE of NaN weights, saved, and a run marked complete;
    then the first batch holding an inf stopped the run, but only once the model was built and the
    trainer fed. The count is known before anything runs: one ConfigError line (exit 2) naming the
    cache, the count and the cure, before the model is built; no run file, no SAE. Reference: the
    cache's own rows and attribute read by h5py."""
    source = loud_cache(tmp_path / "cache.h5", "float16")
    with h5py.File(source) as f:
        ds = f["captures/mlp/lin/output"]
        n_inf = int(np.isinf(ds[:]).sum())
        assert ds.dtype == np.float16 and n_inf > 0 and int(ds.attrs["overflow_values"]) == n_inf
    msg = refused(str(source), tmp_path, monkeypatch, capture="mlp/lin/output")
    assert msg == (f"sae.from: {source}'s capture mlp/lin/output holds {n_inf} inf value(s) its float16 recording "
                   "overflowed (above 65504; its overflow_values attribute): an SAE trained on them has NaN weights; "
                   "record the cache again with dtype: float32 or bfloat16")


def test_a_float32_cache_holding_inf_is_refused_at_its_first_batch(tmp_path, monkeypatch):
    """A cache that holds inf as the model gave them (float32: no overflow counted, so nothing to tell
    before reading): the batch check stops the run in one line before the trainer sees it; no SAE."""
    model = Loud()
    with torch.no_grad():
        model.lin.bias[3] = float("inf")  # (float32 inf in the module's own output)
    source = loud_cache(tmp_path / "cache.h5", "float32", model)
    with h5py.File(source) as f:
        ds = f["captures/mlp/lin/output"]
        assert np.isinf(ds[:]).any() and int(ds.attrs.get("overflow_values", 0)) == 0
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cfg = config(str(source), work / "run", capture="mlp/lin/output", out=str(work / "sae"))
    with pytest.raises(HookrunError) as info:
        hookrun.run(cfg)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("sae: training batch 0 holds ") and "non-finite value(s) (inf)" in msg
    assert msg.endswith(f"the cache's mlp/lin/output ({source}) holds them as recorded (record with check_finite: true "
                        "to stop where they arise)")
    assert not (work / "sae").exists()  # no SAE folder (it was written, every weight NaN)
    with h5py.File(work / "run" / "captures.h5") as f:
        assert f.attrs["status"] != "complete"


def test_a_live_module_giving_nan_is_refused_at_its_first_batch(tmp_path, monkeypatch):
    """sae.at on the fly over a module whose output holds NaN (a weight gone NaN): the same one line."""
    model = Loud()
    with torch.no_grad():
        model.lin.weight[3, 0] = float("nan")
    monkeypatch.chdir(tmp_path)
    cfg = config("unused", tmp_path / "run", out=str(tmp_path / "sae"))
    cfg["sae"] = {**cfg["sae"], "from": None, "capture": None, "at": "lin"}
    data = {"_target_": "hookrun.data.RandomTensors", "n": 64, "shape": [8], "num_classes": 2, "seed": 3}
    with pytest.raises(HookrunError) as info:
        hookrun.run({**cfg, "data": {"dataset": data, "batch_size": 16}}, model=model)
    assert str(info.value).startswith("sae: training batch 0 holds 32 non-finite value(s) (NaN) in 32 of its 32 rows")
    assert str(info.value).endswith("the model's output at lin holds them (its own values over the run's data)")
    assert not (tmp_path / "sae").exists()
