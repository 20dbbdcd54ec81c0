"""A misspelt key inside a block and a misspelt `_target_` get the closest names of their own kind
(issue 34, items 8 and 15): `+evaluate.ablaton=zero` -> evaluate.ablation (the block's own keys,
listed), `torchvision.models.resnet181` -> torchvision.models.resnet18 (the names that module has)."""

from __future__ import annotations

import pytest
from conftest import run_cli

from hookrun.config.build import build
from hookrun.config.schema import load
from hookrun.errors import ConfigError

MODEL = {"_target_": "torchvision.models.resnet18"}


@pytest.mark.parametrize(("key", "close"), [("ablaton", "evaluate.ablation"), ("metrics", "evaluate.mean"),
                                            ("enable", "evaluate.enabled")])
def test_a_misspelt_key_of_an_optional_block_suggests_the_blocks_own_keys(key, close):
    with pytest.raises(ConfigError) as exc:
        load({"model": MODEL, "data": {"dataset": {"_target_": "x"}}, "evaluate": {key: "zero"}})
    assert str(exc.value) == (f"evaluate.{key}: not a key of the evaluate block; did you mean {close}? "
                              f"(it has: ablation, enabled, mean)")


def test_a_misspelt_key_of_a_typed_block_keeps_its_suggestion():
    with pytest.raises(ConfigError, match=r"output\.pth: .*did you mean output\.path\? \(output has: checksum, "):
        load({"model": MODEL, "data": {"dataset": {"_target_": "x"}}, "output": {"pth": "a.h5"}})


@pytest.mark.parametrize(("target", "hint"), [
    ("torchvision.models.resnet181", "torchvision.models has no 'resnet181'; did you mean torchvision.models.resnet18 or "),
    ("torch.nn.Linearr", "torch.nn has no 'Linearr'; did you mean torch.nn.Linear"),
    ("hookrun.models.tiny_llm", "hookrun.models has no 'tiny_llm'; did you mean hookrun.models.tiny_lm or hookrun.models.tiny_cnn?"),
    ("torchvision.modls.resnet18", "torchvision has no 'modls'; did you mean torchvision.models"),
    ("torchvison.models.resnet18", "no module 'torchvison': is the package installed and the name spelt right?"),
])
def test_a_misspelt_target_names_the_closest_names_in_its_module(target, hint):
    with pytest.raises(ConfigError) as exc:
        build({"_target_": target}, "model")
    assert str(exc.value).startswith(f"model: cannot import {target!r} ({hint}")


@pytest.mark.slow
def test_the_cli_says_both_in_one_line():
    done = run_cli("+evaluate.ablaton=zero", "dry_run=true")
    assert done.returncode == 2
    assert done.stderr.strip().endswith("did you mean evaluate.ablation? (it has: ablation, enabled, mean)")
    done = run_cli("model._target_=torchvision.models.resnet181", "dry_run=true")
    assert done.returncode == 2
    assert "did you mean torchvision.models.resnet18 or" in done.stderr and len(done.stderr.strip().splitlines()) == 1
