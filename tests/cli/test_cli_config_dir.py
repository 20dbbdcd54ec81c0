"""A user's experiment from `--config-dir DIR` (or hydra.searchpath) that holds a kind's block takes
`BLOCK.key=value` overrides like a shipped one (the early missing-block check once composed the shipped
conf/ alone and said the block was missing); a config that cannot be composed at all gets Hydra's own
line, not a claim that the block is missing. Reference: the run's recorded config, read with h5py/yaml."""

from __future__ import annotations

import h5py
import pytest
import yaml
from conftest import ENV, run_cli

MINE = """# @package _global_
defaults:
  - override /model: tiny_cnn
  - override /data: shapes
attribution:
  method: saliency
"""
SMALL = ["data.dataset.size=2", "data.batch_size=2", "device=cpu", "progress=false"]


@pytest.mark.parametrize("where", [["--config-dir", "mycfg"], ["hydra.searchpath=[file://mycfg]"]])
def test_a_users_experiment_with_a_block_takes_its_keys(tmp_path, where):
    (tmp_path / "mycfg" / "experiment").mkdir(parents=True)
    (tmp_path / "mycfg" / "experiment" / "mine.yaml").write_text(MINE)
    done = run_cli(*where, "experiment=mine", "attribution.method=input_x_gradient", *SMALL, "hydra.run.dir=run",
                   cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        assert yaml.safe_load(f.attrs["config"])["attribution"]["method"] == "input_x_gradient"


def test_a_config_that_does_not_compose_is_not_said_to_lack_the_block(tmp_path):
    done = run_cli("experiment=no_such_one", "attribution.method=saliency", "hydra.run.dir=run", cwd=tmp_path, env=ENV)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "no_such_one" in lines[0] and "has no attribution block" not in lines[0]
