"""A user's kind registered by `imports:` with its block in an experiment's YAML (`# @package _global_`,
`imports: [latekind]` beside `latekind: {factor: 2.5}`), as the command line's `imports=[latekind]
+latekind={factor: 2.5}` gives it: Hydra composed the file before imports: was read, so the run stopped at
"In 'experiment/mine': ConfigKeyError raised while composing config: latekind: Key 'latekind' not in
'HookrunConfig'". Now the file runs (the command line, a -m sweep over its key, hookrun.compose), and a key
that no kind has is hookrun's own line with the close name. Reference: the package's model called
directly, times the factor (the kind's rows read with h5py)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import warm_python
from site_package import imported, install, scaled_kind, site_env

KIND = scaled_kind("latekind")

EXPERIMENT = """# @package _global_
defaults:
  - override /model: custom
  - override /data: custom
imports: [latekind]
model: {_target_: latekind.tiny}
data: {dataset: {_target_: latekind.data}, batch_size: 4}
device: cpu
progress: false
BLOCK: {factor: 2.5}
"""


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    root = tmp_path_factory.mktemp("late")
    site = install(root / "site", "latekind", KIND, "")
    (root / "mycfg/experiment").mkdir(parents=True)
    (root / "mycfg/experiment/mine.yaml").write_text(EXPERIMENT.replace("BLOCK", "latekind"))
    (root / "mycfg/experiment/typo.yaml").write_text(EXPERIMENT.replace("BLOCK", "latekinds"))
    with imported(site, "latekind") as pkg, torch.no_grad():
        sums = pkg.tiny().eval()(pkg.data().tensors[0]).sum(1).numpy()
    return root, site, sums


def hookrun_cli(root, site, *args):
    return warm_python.run_module("hookrun", ["--config-dir", "mycfg", *args], cwd=root, env=site_env(site), timeout=300)


def test_a_block_of_an_imported_kind_in_an_experiment_file_runs(place):
    root, site, sums = place
    done = hookrun_cli(root, site, "experiment=mine", "hydra.run.dir=one")
    assert done.returncode == 0, done.stderr
    with h5py.File(root / "one/captures.h5") as f:
        assert f.attrs["status"] == "complete"
        np.testing.assert_allclose(f["captures/latekind/__model__/sum"][:], sums * 2.5, rtol=1e-6)
    swept = hookrun_cli(root, site, "-m", "experiment=mine", "latekind.factor=1,3", "hydra.sweep.dir=sweep")
    assert swept.returncode == 0, swept.stderr
    for job, factor in (("0", 1.0), ("1", 3.0)):
        with h5py.File(root / "sweep" / job / "captures.h5") as f:
            np.testing.assert_allclose(f["captures/latekind/__model__/sum"][:], sums * factor, rtol=1e-6)
    composed = warm_python.run_code(f"import hookrun; print(hookrun.compose('hydra.searchpath=[file://{root / 'mycfg'}]', "
                                    "'experiment=mine')['latekind'])", [], cwd=root, env=site_env(site), timeout=300)
    assert composed.returncode == 0 and composed.stdout.strip() == "{'factor': 2.5}", composed.stderr


def test_a_key_no_kind_has_is_hookruns_line_with_the_close_name(place):
    root, site, _ = place
    done = hookrun_cli(root, site, "experiment=typo", "hydra.run.dir=typo")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("hookrun: error: Key 'latekinds' not in 'HookrunConfig'; did you mean latekind?"), done.stderr
    assert not (root / "typo/captures.h5").exists()
