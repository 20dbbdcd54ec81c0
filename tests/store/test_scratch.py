"""A kind's scratch folder (hookrun/output/scratch.py): beside the run's file, or in an object-store
run's staging folder, never the system's temporary folder where a folder is known; a killed run's
(SIGKILL: no clean-up ran) is cleared by the next run of that output. The kinds' runs:
tests/probe/test_probe_spill_resume.py, tests/similarity/test_similarity_spool.py."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hookrun.config.schema import OutputConfig
from hookrun.output.scratch import Scratch


def test_beside_the_file_a_killed_runs_folder_cleared_and_removed_at_the_end(tmp_path):
    out = OutputConfig(path=str(tmp_path / "captures.h5"))
    left = tmp_path / ".probe_rows.captures.h5.rank-00001"
    left.mkdir()
    (left / "rows.h5").write_bytes(b"a killed run's rows")
    s = Scratch(out, "probe_rows", rank=1)
    assert s.path == left and s.path.is_dir() and not list(s.path.iterdir())  # the old rows are gone
    other = Scratch(out, "probe_rows", rank=0)  # another rank's: its own folder
    assert other.path == tmp_path / ".probe_rows.captures.h5.rank-00000" and left.is_dir()
    s.cleanup()
    other.cleanup()
    assert not list(tmp_path.iterdir())


def test_an_object_stores_in_its_staging_folder_else_the_systems_temporary_folder(tmp_path):
    staged = Scratch(OutputConfig(path="s3://bucket/run/captures.h5", staging=str(tmp_path)), "similarity_rows")
    assert staged.path == tmp_path / ".similarity_rows.captures.h5.rank-00000"
    staged.cleanup()
    for output in (OutputConfig(path="s3://bucket/run/captures.h5"), None):
        s = Scratch(output, "similarity_rows")
        assert s.path.parent == Path(tempfile.gettempdir()) and s.path.name.startswith("hookrun-similarity_rows-")
        s.cleanup()
        assert not s.path.exists()
