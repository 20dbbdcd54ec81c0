"""Where a relative output.path lands (issue 47 item 4, docs/config.md "Where a relative output.path
lands"): the command line and hookrun.compose in the run folder (hydra.run.dir), a dict given to
hookrun.run in the working folder; docs/report.md's notebook example writes where its comment says.
Reference: the files found on disk after each route, and the page's own text."""

from __future__ import annotations

import os
import re

import pytest
import warm_python
from conftest import ENV, ROOT, run_cli
from doc_blocks import env, parse

import hookrun

SMALL = ["model=tiny_cnn", "data=shapes", "data.dataset.size=2", "data.batch_size=2", "device=cpu", "progress=false",
         "hooks={f: {at: fc, type: forward}}"]


def files(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.h5"))


@pytest.mark.slow
def test_the_command_line_and_compose_agree_and_the_dict_route_is_the_working_folder(tmp_path, monkeypatch):
    cli = tmp_path / "cli"
    cli.mkdir()
    done = run_cli(*SMALL, "output.path=sub/c.h5", "hydra.run.dir=R", cwd=cli, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    assert files(cli) == ["R/sub/c.h5"]

    composed = tmp_path / "compose"
    composed.mkdir()
    monkeypatch.chdir(composed)
    cfg = hookrun.compose(*SMALL, "output.path=sub/c.h5", "hydra.run.dir=R")
    assert cfg["output"]["path"] == os.path.join("R", "sub", "c.h5")
    hookrun.run(cfg)
    assert files(composed) == files(cli)
    undated = hookrun.compose(*SMALL, "output.path=sub/c.h5")["output"]["path"]  # no hydra.run.dir: a dated folder
    assert re.fullmatch(r"outputs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d/sub/c\.h5", undated)

    plain = tmp_path / "dict"
    plain.mkdir()
    monkeypatch.chdir(plain)
    cfg = hookrun.compose(*SMALL)
    cfg["output"]["path"] = "sub/c.h5"  # a dict edited by hand: no run folder, the working folder
    hookrun.run(cfg)
    assert files(plain) == ["sub/c.h5"]


@pytest.mark.slow
def test_the_report_pages_notebook_example_writes_where_it_says(tmp_path):
    (block,) = [code for lang, code, _ in parse((ROOT / "docs" / "report.md").read_text())
                if lang == "python" and "hookrun.compose(" in code]
    said = re.search(r"run = hookrun\.run\(cfg\)\s+# (\S+)", block).group(1)  # the comment names the file
    done = warm_python.run_code(block, [], cwd=tmp_path, env=env(), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert files(tmp_path) == [said]
    assert (tmp_path / said).with_name("report.html").is_file()
