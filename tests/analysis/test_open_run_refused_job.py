"""open_run on a sweep folder whose only job was refused before its file opened (its folder holds the
`refused.txt` docs/format.md describes, and no run's file): it said "give a job's folder, e.g. 'b0/0'", a folder
with no file, which open_run then refused as "no file 'b0/0/captures.h5'". Now both say the job was refused and
why. References: the sweep's own stderr line and the job folder's refused.txt, read as text."""

from __future__ import annotations

import pytest
from conftest import run_cli

import hookrun
from hookrun.errors import NotFoundError


def test_open_run_of_a_sweep_whose_only_job_was_refused_says_so_and_why(tmp_path):
    done = run_cli("-m", "experiment=ablate_layer3", "hooks.ablate.at=nope", "params.factor=0.5", "data.limit=1",
                   "data.batch_size=2", "progress=false", "hydra.sweep.dir=b0", cwd=tmp_path)
    line = (tmp_path / "b0" / "0" / "refused.txt").read_text(encoding="utf-8").strip()
    assert "ResNet has no module 'nope'" in line and f"hookrun: error: {line}" in done.stderr
    assert not list((tmp_path / "b0").rglob("*.h5"))

    with pytest.raises(NotFoundError) as got:
        hookrun.open_run(tmp_path / "b0")
    assert str(got.value) == (f"{str(tmp_path / 'b0')!r} is a sweep folder none of whose 1 job(s) left a run's file: "
                              f"job 0 was refused: {line}; run the sweep again once that is fixed")
    with pytest.raises(NotFoundError) as got:
        hookrun.open_run(tmp_path / "b0" / "0")
    assert str(got.value) == (f"{str(tmp_path / 'b0' / '0')!r} is a sweep's job that left no run's file: it was "
                              f"refused: {line}; run it again once that is fixed")


def test_the_hint_names_a_job_that_has_a_file(tmp_path):
    """Job 0 refused (Hydra's launcher stops there), job 1's folder a complete run moved in from another sweep:
    the hint names job 1, the one open_run reads."""
    for folder, at in (("b0", "nope"), ("ok", "layer3")):
        run_cli("-m", "experiment=ablate_layer3", f"hooks.ablate.at={at}", "params.factor=0.5", "data.limit=1",
                "data.batch_size=2", "progress=false", f"hydra.sweep.dir={folder}", cwd=tmp_path)
    (tmp_path / "ok" / "0").rename(tmp_path / "b0" / "1")
    assert (tmp_path / "b0" / "0" / "refused.txt").is_file() and (tmp_path / "b0" / "1" / "captures.h5").is_file()
    with pytest.raises(NotFoundError, match=r"give a job's folder, e.g. '.*b0/1'"):
        hookrun.open_run(tmp_path / "b0")


def test_a_nested_sweep_subdir_names_each_jobs_fate(tmp_path):
    """hydra.sweep.subdir=a/${hydra.job.num}: each job's folder is b0/a/N. open_run looked one level down only
    and said the sweep folder had 'no job's run in it'; now it names each job and its refusal (reference: each
    job folder's refused.txt, read as text)."""
    run_cli("-m", "experiment=ablate_layer3", "hooks.ablate.at=nope", "params.factor=0.5", "data.limit=1",
            "data.batch_size=2", "progress=false", "hydra.sweep.dir=b0", "hydra.sweep.subdir=a/${hydra.job.num}",
            cwd=tmp_path)
    line = (tmp_path / "b0" / "a" / "0" / "refused.txt").read_text(encoding="utf-8").strip()
    assert "ResNet has no module 'nope'" in line
    with pytest.raises(NotFoundError) as got:
        hookrun.open_run(tmp_path / "b0")
    assert str(got.value) == (f"{str(tmp_path / 'b0')!r} is a sweep folder none of whose 1 job(s) left a run's file: "
                              f"job a/0 was refused: {line}; run the sweep again once that is fixed")
