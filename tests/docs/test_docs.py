"""Every docs page's code (docs/*.md, docs/benchmarks/*.md) runs as written, as the README's does (tests/helpers/doc_blocks.py): every
```python block, in one namespace per page, and every ```bash command, in one folder that all
pages share. A block that cannot run here (a cluster, an S3 server, a download, a full-size run of
minutes) is marked `<!-- no-run: why -->`; the count of marks per page is printed.

The pages read the runs the README makes (`outputs/first`, `outputs/sweep`, `outputs/sae_cache`,
`saes/h3`, ...): this test makes them once, at test size (a batch or two), in that folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from doc_blocks import ROOT, env, parse, run_page

import hookrun

PAGES = sorted((ROOT / "docs").rglob("*.md"))  # docs/benchmarks/ holds a page per area
SMALL = ("progress=false", "data.limit=1")
RUNS = {  # the folder a page reads -> the overrides that make it (at test size)
    "outputs/first": ("experiment=resnet_layer1", "data.batch_size=4"),
    "outputs/sae_cache": ("experiment=sae_cache", "data.dataset.limit=32"),
    "outputs/evaluated": ("experiment=ablation_sweep", "data.batch_size=4", "data.dataset.limit=4"),
    "outputs/steer": ("experiment=gpt2_steer_generate", "data.batch_size=2", "generate.max_new_tokens=4"),
    "outputs/attention": ("experiment=gpt2_attention", "data.batch_size=4"),
}
# A page's full-size runs, at the smaller size the page documents (sae.md: tests/sae/test_sae_figures.py's
# cache lines, training budget and held-out lines): the commands run as written, with these appended
SIZES = {
    "sae.md": {
        "python -m hookrun experiment=sae_cache hydra.run.dir=outputs/h3_cache": ("data.dataset.limit=128",),
        "python -m hookrun experiment=sae_train hydra.run.dir=outputs/h3_sae": (
            "sae.rows=40960", "sae.batch_rows=512", "sae.lr_schedule.warmup=10"),
        "python -m hookrun experiment=sae_eval params.sae=saes/h3 hydra.run.dir=outputs/h3_eval": ("data.dataset.limit=64",),
    },
}
SWEEPS = (["-m", "experiment=ablate_layer3", "params.factor=0,0.5,1", "data.batch_size=2", "hydra.sweep.dir=outputs/sweep"],
          ["-m", "experiment=gpt2_steer_generate", "params.factor=0,4,8", "data.batch_size=2", "generate.max_new_tokens=4",
           "hydra.sweep.dir=outputs/steer_sweep"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The runs and the SAE folder the pages read, made in-process (a sweep needs the CLI)."""
    here = tmp_path_factory.mktemp("docs")
    sweeps = [subprocess.Popen([sys.executable, "-m", "hookrun", *sweep, *SMALL], cwd=here, env=env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for sweep in SWEEPS]
    cwd = os.getcwd()
    os.chdir(here)
    try:
        for run_dir, overrides in RUNS.items():
            hookrun.run(hookrun.compose(*overrides, *SMALL, f"hydra.run.dir={run_dir}"))
        save_standard_sae("saes/h3", 128, 512, "transformer.h.3")  # tiny_lm's width; the folder sae_train writes
    finally:
        os.chdir(cwd)
    for sweep in sweeps:
        assert sweep.wait(timeout=600) == 0, sweep.stderr.read()[-3000:]
    return here


def test_every_page_is_found():
    assert {p.name for p in PAGES} >= {"analysis.md", "caches.md", "format.md", "sae.md", "config.md"}


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT / "docs").as_posix() for p in PAGES])
def test_every_block_of_the_page_runs(page, folder):
    code = [b for b in parse(page.read_text()) if b[0] in ("bash", "python")]
    ran, marked = run_page(page, folder, env(), sizes=SIZES.get(page.name))
    print(f"{page.name}: {ran} blocks and commands run, {marked} block(s) marked no-run")
    assert ran + marked >= len(code)


def save_standard_sae(out: str, d_in: int, d_sae: int, hook_name: str) -> None:
    """A random SAELens 6 standard SAE folder (cfg.json + sae_weights.safetensors), seeded."""
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    w = torch.randn(d_in, d_sae, generator=g) / d_in**0.5
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architecture": "standard", "d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": True, "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"hook_name": hook_name, "sae_lens_version": "6.0.0", "sae_lens_training_version": None}}
    (folder / "cfg.json").write_text(json.dumps(cfg, indent=2))
    save_file({"W_enc": w.contiguous(), "W_dec": w.T.contiguous(), "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)},
              str(folder / "sae_weights.safetensors"))
