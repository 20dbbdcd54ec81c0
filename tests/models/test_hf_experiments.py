"""The transformers and detection experiments, run as a user runs them: from an installed wheel,
offline, in a folder outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from shipped_configs import composed

pytest.importorskip("transformers")


@pytest.mark.parametrize("exp, path, shape", [
    ("bert_cls", "captures/cls/encoder.layer.1/output", (8, 1, 64)),
    ("llama_steer", "captures/logits/lm_head/output", (8, 259)),
])
def test_experiment_configs_run(tmp_path, exp, path, shape):
    import hookrun

    cfg = composed(f"experiment={exp}", "data.limit=2", "progress=false", "device=cpu", f"output.path={tmp_path / 'c.h5'}")
    hookrun.run(cfg)
    with h5py.File(tmp_path / "c.h5") as f:
        assert f[path].shape == shape and f.attrs["status"] == "complete"


@pytest.mark.slow
def test_experiments_run_offline_from_the_wheel(tmp_path, wheel_site):
    names, site = wheel_site
    for name in ("hookrun/data/sample.txt", "hookrun/models/hf.py", "hookrun/conf/model/hf.yaml",
                 "hookrun/conf/data/text.yaml", "hookrun/conf/experiment/gpt2_residual.yaml"):
        assert name in names
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for exp in ("gpt2_residual", "detection_boxes"):
        proc = subprocess.run([sys.executable, "-m", "hookrun", f"experiment={exp}", "data.limit=2", "progress=false",
                               f"output.path={work / exp}.h5"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    with h5py.File(work / "gpt2_residual.h5") as f:
        mask = f["samples/attention_mask"][:]
        rows = f["captures/resid/transformer.h.1/output"]
        assert rows.attrs["rows"] == "tokens" and rows.shape == (mask.sum(), 64)
        np.testing.assert_array_equal(f["samples/token_sample"][:], np.nonzero(mask)[0])
        np.testing.assert_array_equal(f["samples/token_position"][:], np.nonzero(mask)[1])
    with h5py.File(work / "detection_boxes.h5") as f:
        boxes = f["captures/detections/__model__/output.boxes"]
        assert boxes.shape == (8,) and all(len(boxes[i]) % 4 == 0 for i in range(8))
