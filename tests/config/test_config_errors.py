"""A misspelt key inside a block and a misspelt `_target_` get the closest names of their own kind
(issue 34, items 8 and 15): `+evaluate.ablaton=zero` -> evaluate.ablation (the block's own keys,
listed), `torchvision.models.resnet181` -> torchvision.models.resnet18 (the names that module has)."""

from __future__ import annotations

import pytest
from conftest import run_cli

from hookrun.config import load
from hookrun.config.build import build
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


@pytest.mark.parametrize(("extra", "message"), [
    ({"model": "LIVE"}, "model: a Linear object cannot be in a config (it holds numbers, strings, lists and mappings); "
                        "pass it live: hookrun.run(cfg, model=module)"),
    ({"data": {"dataset": "LIVE"}}, "data.dataset: a Linear object cannot be in a config (it holds numbers, strings, "
                                    "lists and mappings); pass it live: hookrun.run(cfg, dataset=items)"),
    ({"similarity": {"at": ["fc"], "with": {"model": "LIVE", "at": ["fc"]}}},  # (was similarity.with_.model: Value ...)
     "similarity.with.model: a Linear object cannot be in a config (it holds numbers, strings, lists and mappings); "
     "pass it live: hookrun.similarity(model, dataset, with_={'model': module, 'at': [...]}, at=[...])"),
    ({"output": {"path": "a.h5"}, "probe": {"at": "fc", "target": "label", "test_data": "LIVE"}},  # (a kind's `live`)
     "probe.test_data: a Linear object cannot be in a config (it holds numbers, strings, lists and mappings); "
     "pass it live: hookrun.probe(model, dataset, test_data=items, at=[...], target=...)"),
    ({"output": {"path": "a.h5"}, "probe": {"at": "fc", "target": "LIVE"}},  # (a key no call takes live)
     "probe.target: a Linear object cannot be in a config (it holds numbers, strings, lists and mappings); "
     "name what builds it: {_target_: package.module.Name, ...}"),
    ({"output": {"path": "a.h5"}, "probe": {"at": "fc", "split": 0.3}},
     "probe.split=0.3: a mapping of its keys (test, seed); set one with probe.split.test=..., or give {test: ..., seed: ...}"),
    ({"output": 5}, "output=5: a mapping of its keys (path, compression, dtype,"),
    ({"output": {"path": "a.h5", "overwrite": 5}}, "output.overwrite=5 is not a boolean; give true or false"),
    ({"output": {"path": "a.h5"}, "probe": {"at": "fc", "standardize": 3}}, "probe.standardize=3 is not a boolean"),
])
def test_an_object_or_a_value_where_a_config_wants_other_is_one_line(extra, message):
    """A Python object put in the config dict (OmegaConf: "Value 'Linear' is not a supported primitive type"),
    one value where a block of keys goes (OmegaConf: "Merge error: float is not a subclass of Split")."""
    import torch

    def live(node):
        return {k: live(v) for k, v in node.items()} if isinstance(node, dict) else torch.nn.Linear(2, 2) if node == "LIVE" else node

    with pytest.raises(ConfigError) as exc:
        load(live({"model": MODEL, "data": {"dataset": {"_target_": "x"}}, **extra}))
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


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


def test_a_new_key_in_an_action_says_how_to_add_it_and_not_that_the_action_has_no_keys():
    """hooks.lens.actions.0 has six keys (the user's: never listed in the config's key list); the
    message said "hooks.lens.actions.0 has no keys" beside the + hint."""
    from hookrun.cli.hydra_errors import _unknown_key_message

    key = "hooks.lens.actions.0.translator"
    message = _unknown_key_message(key, [f"{key}=foo.pt"], ["hooks", "hooks.lens", "hooks.lens.at", "model"])
    assert "has no keys" not in message and f"write +{key}=foo.pt" in message, message


def test_an_unknown_key_under_a_new_hook_lists_the_hooks_and_a_typo_in_a_hook_is_not_told_to_add_it():
    """hooks.0.module (a list's syntax for the mapping of named hooks) printed "did you mean ...? ()"
    (the empty listing of hooks.0); a typo in an existing hook's own keys was told to add it with +,
    which the hook's schema then refuses."""
    from hookrun.cli.hydra_errors import _unknown_key_message

    keys = ["hooks", "hooks.blocks", "hooks.blocks.at", "hooks.blocks.type", "hooks.blocks.actions", "model"]
    message = _unknown_key_message("hooks.0.module", ["hooks.0.module=x"], keys)
    assert "()" not in message and "(hooks has: blocks)" in message and "write +hooks.0.module=x" in message, message
    message = _unknown_key_message("hooks.blocks.modle", ["hooks.blocks.modle=x"], keys)
    assert "hooks.blocks has: actions, at, type" in message and "+" not in message, message


@pytest.mark.slow
def test_verbose_prints_the_traceback_and_keeps_the_one_line_and_its_exit_status():
    """--verbose raised Hydra's exception: a traceback and exit 1 where the same config without it exits 2."""
    done = run_cli("data.batchsize=8", "dry_run=true", "--verbose")
    assert done.returncode == 2, done.stderr
    assert "Traceback" in done.stderr and done.stderr.strip().splitlines()[-1].startswith("hookrun: error: data.batchsize=8")


def test_hydras_defaults_list_and_null_key_messages_become_the_command_lines():
    """`+loss=sum` named the defaults list's syntax ('override loss: sum'); `~output.max_bytes` (null) said the
    key does not exist; output.max_bytes=-5 was reported as a file larger than -5 bytes."""
    from hydra.errors import ConfigCompositionException

    from hookrun.cli.hydra_errors import one_line
    from hookrun.config import check_config, load

    keys = lambda: ["loss", "output", "output.max_bytes"]  # noqa: E731
    exc = ConfigCompositionException("Multiple values for loss. To override a value use 'override loss: sum'")
    assert one_line(exc, ["+loss=sum"], keys, lambda g: []) == \
        "+loss=sum: the config already chooses a loss; choose another without the +: loss=sum"
    exc = ConfigCompositionException("Could not delete from config. 'output.max_bytes' does not exist.")
    assert one_line(exc, ["~output.max_bytes"], keys, lambda g: []).startswith(
        "~output.max_bytes: output.max_bytes is already unset (null)")
    with pytest.raises(ConfigError, match=r"^output.max_bytes=-5; give bytes as a number or with a unit \(512MB, 2GiB\)$"):
        check_config(load({"model": {"_target_": "torch.nn.Identity"}, "data": {"dataset": {"_target_": "x.y"}},
                           "output": {"max_bytes": -5}}))


def test_a_part_size_below_one_byte_is_refused_on_a_local_path_too(tmp_path):
    """output.part_bytes=-5 was checked only where an object store cut parts: a local run took it silently."""
    import torch

    import hookrun

    with pytest.raises(ConfigError, match=r"^output.part_bytes=-5; give bytes as a number or with a unit \(512MB, 2GiB\)$"):
        hookrun.run({"hooks": {"h": {"at": "0", "type": "forward"}}, "progress": False,
                     "output": {"path": str(tmp_path / "a.h5"), "part_bytes": -5}},
                    model=torch.nn.Sequential(torch.nn.Linear(4, 2)), dataset=torch.randn(4, 4))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("given", "bytes_"), [("2GB", 2 * 10**9), ("512MiB", 512 * 2**20), (" 1.5 kb ", 1500),
                                               (4096, 4096), ("700", 700)])
def test_output_sizes_take_the_units_every_size_key_takes(given, bytes_):
    """output.max_bytes (and output.part_bytes) took a number of bytes only ('2GB': OmegaConf's 'could not be
    converted to Integer'), while probe.memory, similarity.memory, ... take 2GB, 512MiB: one parser now."""
    cfg = load({"model": MODEL, "data": {"dataset": {"_target_": "x"}},
                "output": {"max_bytes": given, "part_bytes": given}})
    assert (cfg.output.max_bytes, cfg.output.part_bytes) == (bytes_, bytes_)


def test_a_size_on_the_command_line_bounds_the_run_and_a_bad_one_is_one_line(tmp_path):
    hooks = "hooks={r: {at: block1, type: forward}}"
    done = run_cli("model=tiny_cnn", "data=shapes", "data.limit=1", "progress=false", hooks, "output.max_bytes=1KB",
                   f"hydra.run.dir={tmp_path / 'a'}")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "exceeds output.max_bytes=1000; record less (what, select, reduce, dtype, every, limit, data.limit) or raise "
        "output.max_bytes (dry_run=true shows the estimate per capture)"), done.stderr
    done = run_cli("model=tiny_cnn", hooks, "output.max_bytes=2GBs", f"hydra.run.dir={tmp_path / 'b'}")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "hookrun: error: output.max_bytes='2GBs'; give bytes as a number or with a unit (512MB, 2GiB)"], done.stderr
    assert not (tmp_path / "b" / "captures.h5").exists()
