"""dry_run=true on every shipped experiment (conf/experiment/) exits 0, prints its plan and leaves no
file or folder behind. Three read another experiment's output, made here small first: patch_layer2
(clean_reference's file), sae_train (sae_cache's) and sae_eval (an SAE folder, written by hand as
SAELens lays it out). Before: logit_lens' dry run failed ("the batch has no such tensor": the estimate
gave the lens no batch) and probe_shapes / probe_tokens raised KeyError (a probe not prepared was stepped).
Reference: the folder's own listing before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import ENV, HELPERS, ROOT

import hookrun

pytestmark = pytest.mark.slow
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
PATCH = "data.dataset.size=2"  # patch_layer2's and its clean run's data: 2 images, not 64


def inputs(folder: Path) -> None:
    """What patch_layer2, sae_train and sae_eval read, at the paths their configs name (relative to the run)."""
    cpu = ("device=cpu", "progress=false")  # (the clean run: every sample patch_layer2 runs, PATCH)
    hookrun.run(hookrun.compose("experiment=clean_reference", *cpu, PATCH, f"output.path={folder}/outputs/clean/captures.h5"))
    hookrun.run(hookrun.compose("experiment=sae_cache", *cpu, "data.batch_size=2", "data.dataset.limit=2",
                                f"output.path={folder}/outputs/h3_cache/captures.h5"))
    sae = folder / "saes" / "h3"
    sae.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    safetensors.torch.save_file({"W_enc": torch.randn(128, 16, generator=g), "W_dec": torch.randn(16, 128, generator=g),
                                 "b_enc": torch.zeros(16), "b_dec": torch.zeros(128)}, str(sae / "sae_weights.safetensors"))
    (sae / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": 128, "d_sae": 16, "dtype": "float32",
                                              "apply_b_dec_to_input": True, "normalize_activations": "none"}))


def listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size if p.is_file() else -1 for p in sorted(folder.rglob("*"))}


def test_every_shipped_experiment_has_a_dry_run(tmp_path):
    assert len(EXPERIMENTS) > 20
    inputs(tmp_path)
    before = listing(tmp_path)
    proc = subprocess.run([sys.executable, str(HELPERS / "dry_runs.py"),
                           *(f"{e} {PATCH}" if e == "patch_layer2" else e for e in EXPERIMENTS)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = {name: r["stderr"][-600:] for name, r in runs.items() if r["code"] != 0 or "Traceback" in r["stderr"]}
    assert not failed, failed
    assert listing(tmp_path) == before  # no run folder, file or scratch folder left
