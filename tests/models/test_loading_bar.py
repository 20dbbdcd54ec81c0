"""transformers' weight-loading bar follows the run's `progress` (issue 34, item 18): with
progress=false a run that reads model=tiny_lm from its folder prints no bar; with progress=true it
does (so the test can tell them apart), and the library's own setting is left as it was."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

import hookrun

transformers = pytest.importorskip("transformers")


def run_tiny_lm(tmp_path, progress: bool) -> None:
    cfg = hookrun.compose("model=tiny_lm", "data=text", "data.limit=1", "data.batch_size=2", "device=cpu",
                          f"progress={str(progress).lower()}", f"output.path={tmp_path / 'c.h5'}", "output.overwrite=true",
                          "hooks={h: {at: transformer.h.0, type: forward}}")
    hookrun.run(cfg)


@pytest.mark.parametrize("progress", [False, True])
def test_the_loading_bar_shows_only_with_progress(tmp_path, capfd, progress):
    before = transformers.utils.logging.is_progress_bar_enabled()
    run_tiny_lm(tmp_path, progress)
    err = capfd.readouterr().err
    assert ("Loading weights" in err) == progress
    assert transformers.utils.logging.is_progress_bar_enabled() == before
