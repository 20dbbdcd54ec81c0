"""A refused run changes nothing: every file of an existing run's folder (captures.h5, .hydra/*.yaml,
hookrun.log) keeps its bytes after a second run into it is refused, whatever the reason; an accepted
run still leaves Hydra's record. Reference: the folder's own bytes (sha256) before the refusals,
and the overrides as given on the command line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from conftest import ENV, run_cli

from hookrun.store.paths import OutputLock

pytestmark = pytest.mark.slow
ARGS = ["model=tiny_cnn", "data=shapes", "data.dataset.size=4", "data.batch_size=2", "device=cpu",
        "progress=false", "hooks={f: {at: fc, type: forward}}"]


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hookrun:")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


def test_a_refused_run_leaves_the_run_folder_byte_for_byte(tmp_path):
    run = ["hydra.run.dir=run", *ARGS]
    first = run_cli(*run, cwd=tmp_path, env=ENV)
    assert first.returncode == 0, first.stderr[-2000:]
    folder = tmp_path / "run"
    before = digests(folder)
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "hookrun.log", "captures.h5"} <= set(before)
    assert yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) == ARGS  # (hydra.* are hydra.yaml's)
    first_log = (folder / "hookrun.log").read_text()
    assert "file: " in first_log

    assert "exists" in refused(run_cli(*run, cwd=tmp_path, env=ENV))
    with OutputLock(folder / "captures.h5"):  # a second writer holds the file
        assert "another hookrun run" in refused(run_cli(*run, "output.overwrite=true", cwd=tmp_path, env=ENV))
    assert "data.batch_size" in refused(run_cli(*run, "output.overwrite=true", "data.batch_size=abc", cwd=tmp_path, env=ENV))
    assert "seeed" in refused(run_cli(*run, "output.overwrite=true", "seeed=1", cwd=tmp_path, env=ENV))
    # found by hookrun's own checks, after Hydra has composed the config and made the folder
    assert "data.batch_size" in refused(run_cli(*run, "output.overwrite=true", "data.batch_size=0", cwd=tmp_path, env=ENV))
    assert "nowhere" in refused(run_cli(*run, "output.overwrite=true", "hooks={f: {at: nowhere, type: forward}}",
                                        cwd=tmp_path, env=ENV))
    assert digests(folder) == before

    again = run_cli(*run, "output.overwrite=true", "seed=3", cwd=tmp_path, env=ENV)  # accepted: its record replaces
    assert again.returncode == 0, again.stderr[-2000:]
    assert yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) == [*ARGS, "output.overwrite=true", "seed=3"]
    assert yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())["seed"] == 3
    log = (folder / "hookrun.log").read_text()
    assert log.startswith(first_log) and log.count("file: ") == 2
    assert "error" not in log  # the refusals said so on stderr only


def test_a_refused_run_into_a_new_folder_leaves_no_folder(tmp_path):
    proc = run_cli("hydra.run.dir=out/new", *ARGS, "data.batch_size=0", cwd=tmp_path, env=ENV)
    refused(proc)
    assert not (tmp_path / "out").exists()
