"""`python -m hookrun --help` and `--version` through the real CLI (issue 34, item 13): hookrun's own
help (what it does, the commands this install has, an example, the config reference), Hydra's
groups after it, and hookrun's version (and torch's), not Hydra's."""

from __future__ import annotations

import importlib.util
import re
import shlex
from importlib import metadata

import pytest
import torch
from conftest import ROOT, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def help_text() -> str:
    done = run_cli("--help")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_says_what_hookrun_does_and_names_its_commands(help_text):
    assert help_text.startswith("hookrun: declarative PyTorch hooks")
    assert "powered by Hydra" not in help_text
    listed = re.findall(r"^  python -m (\S+)", help_text, flags=re.M)
    # every python -m command the README names (hookrun.circuits was missing from the list)
    readme = set(re.findall(r"python -m (hookrun(?:\.\w+)?)\b", (ROOT / "README.md").read_text()))
    assert readme >= {"hookrun", "hookrun.modules", "hookrun.inspect", "hookrun.plot", "hookrun.report", "hookrun.circuits"}
    assert readme <= set(listed), readme - set(listed)
    for module in listed:  # only commands this install has
        assert importlib.util.find_spec(module) is not None, module
    for module in ("hookrun.report", "hookrun.patch"):  # named exactly where they exist
        assert (module in listed) == (importlib.util.find_spec(module) is not None)
    assert "docs/config.md" in help_text and (ROOT / "docs" / "config.md").is_file()


def test_hydras_groups_and_config_follow_hookruns_own_help(help_text):
    ours, groups = help_text.index("Commands:"), help_text.index("== Config groups")
    assert ours < groups
    assert re.search(r"^model: .*\btiny_lm\b", help_text, flags=re.M)
    assert re.search(r"^experiment: .*\bresnet_layer1\b", help_text, flags=re.M)
    assert "output:\n  path: captures.h5" in help_text  # the composed config


def test_the_help_examples_run(help_text):
    examples = re.findall(r"^  (python -m hookrun .+?)(?:\s+#.*)?$", help_text.split("Example:")[1], flags=re.M)
    assert examples
    for line in examples:
        args = shlex.split(line)[3:]
        done = run_cli(*args, "dry_run=true", "data.limit=1", "device=cpu")
        assert done.returncode == 0, (line, done.stderr[-2000:])


def test_help_lists_every_kind_with_its_summary_and_experiments(help_text):
    from hookrun.config.plugins import plugin

    part = re.sub(r"\n {5,}", " ", help_text.split("Kinds of run:")[1].split("\n\n")[0])  # a wrapped entry, one line
    folders = sorted(p.parent.name for p in (ROOT / "hookrun/runner/kinds").glob("*/__init__.py")
                     if "KIND = KindPlugin(" in p.read_text())
    assert folders and len(folders) >= 6, folders
    for name in folders:
        line = re.search(rf"^  {name} +(.+)$", part, flags=re.M)
        assert line and line.group(1).startswith(plugin(name).summary) and plugin(name).summary, (name, part)
        shown = re.search(r"\(experiment=(.+)\)$", line.group(1))
        assert shown, (name, line.group(1))  # every shipped kind has an experiment
        for experiment in shown.group(1).split(", "):  # each one's file gives the block
            text = (ROOT / "conf/experiment" / f"{experiment}.yaml").read_text()
            assert re.search(rf"^{name}:", text, flags=re.M), (name, experiment)


def test_version_is_hookruns_and_torchs():
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"hookrun {metadata.version('hookrun')} (torch {torch.__version__}, Python ")
    assert "Hydra" not in done.stdout
