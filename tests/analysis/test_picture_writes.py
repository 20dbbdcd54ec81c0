"""plot's pictures appear whole or not at all (a plot killed while writing a PNG left a cut-off file
under the figure's name), as the report's page always has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]

KILLED = """
import os, signal, sys
from pathlib import Path
from matplotlib.backends import backend_agg
from hookrun.cli import figures

given = backend_agg.FigureCanvasAgg.print_png

def cut_off(self, filename_or_obj, *args, **kwargs):  # writes the PNG's first bytes, then the process is killed
    if not isinstance(filename_or_obj, (str, os.PathLike)):  # (matplotlib's own renderer lookup, into memory)
        return given(self, filename_or_obj, *args, **kwargs)
    with open(filename_or_obj, "wb") as f:
        f.write(b"\\x89PNG\\r\\n\\x1a\\n cut off")
    os.kill(os.getpid(), signal.SIGKILL)

backend_agg.FigureCanvasAgg.print_png = cut_off
fig = figures.pyplot().figure()
fig.add_subplot().plot([0, 1])
figures.save(fig, Path(sys.argv[1]))
"""


def _png_whole(path: Path) -> bool:
    from PIL import Image

    with Image.open(path) as im:
        im.load()  # (a cut-off PNG raises here)
    return True


@pytest.mark.parametrize("before", [False, True])
def test_a_plot_killed_mid_write_leaves_no_cut_off_png(tmp_path, before):
    path = tmp_path / "fig.png"
    if before:  # a whole figure of an earlier plot stays whole
        from hookrun.cli import figures

        fig = figures.pyplot().figure()
        fig.add_subplot().plot([1, 0])
        figures.save(fig, path)
        old = path.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KILLED, str(path)], env=env, capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr.decode()
    if before:
        assert path.read_bytes() == old and _png_whole(path)
    else:
        assert not path.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "fig.png" and not p.name.endswith(".tmp")] == []
