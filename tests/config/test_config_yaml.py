"""The config text each run's file keeps (`to_yaml`) is exactly what OmegaConf writes for the same
dataclass (OmegaConf.to_yaml(OmegaConf.structured(cfg)), the way it was made before): every shipped
experiment, non-default enums and numbers, a kind plugin's block, live objects' nodes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import hookrun
from hookrun.config import load, with_live
from hookrun.config.schema import to_yaml

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[2] / "conf" / "experiment").glob("*.yaml"))


def omegaconf_text(cfg) -> str:
    node = OmegaConf.structured(cfg)
    given = cfg.__dict__.get("_block_nodes")
    if given:
        node = OmegaConf.create({**OmegaConf.to_container(node), **given})
    return OmegaConf.to_yaml(node)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_is_written_as_omegaconf_writes_it(name) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a renamed experiment's warning)
        cfg = load(hookrun.compose(f"experiment={name}"))
    assert to_yaml(cfg) == omegaconf_text(cfg)


def test_enums_numbers_strings_and_blocks_as_omegaconf_writes_them() -> None:
    base = {"model": {"_target_": "torchvision.models.resnet18", "num_classes": 10},
            "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 8}, "batch_size": 4, "limit": 2},
            "mode": "grad", "output": {"path": "out/x.h5", "compression": "gzip", "dtype": "float16", "part_bytes": 1 << 20},
            "hooks": {"a": {"at": "layer1", "type": "forward", "action": "record"}},
            "params": {"text": "yes", "num": "1.0", "empty": "", "unicode": "ü→", "null_text": "null", "list": [1, "2", None]},
            "probe": {"at": ["layer1", "layer2"], "target": "label", "split": {"test": 0.3, "seed": 5}}}
    cfg = load(base)
    assert to_yaml(cfg) == omegaconf_text(cfg)
    live = load(with_live(base, model=object(), dataset=[1]))
    assert to_yaml(live) == omegaconf_text(live)
