"""A file whose kind has no reader in this process (its kind plugin's package not installed here, or
the `imports:` module that registered it not imported) says so, with how to read it, in `run.NAME`'s
error, in the report's header and in plot's output, as inspect does. `run.NAME` named the entry point
for every such file (Run.attrs leaves the config out, so the run's `imports:` were never seen), and
report and plot said nothing.

References: the file's own attributes, written here with h5py (the kind, the config's `imports:`)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import yaml

import hookrun
from hookrun.analysis.report.run_sections import header
from hookrun.cli.plot_command import plot_run

HOW = {  # the config's imports: -> what the note says to do
    None: "ghostkind: no reader for this kind here: the package that declares it (an entry point of hookrun.kinds) "
          "is not installed in this environment; install it for inspect, plot and report to read its rows",
    "ghost_register": "ghostkind: no reader for this kind here (it came from imports: ['ghost_register']): import that "
                      "module before open_run, or declare the kind as an entry point of hookrun.kinds, for inspect, "
                      "plot and report to read its rows",
}


def ghost_file(tmp_path, imports):
    """A record run's file whose root says another machine's kind wrote it (`ghostkind`)."""
    path = hookrun.run({"device": "cpu", "progress": False, "data": {"batch_size": 4},
                        "hooks": {"fc": {"at": "0", "type": "forward", "actions": ["record"]}},
                        "output": {"path": str(tmp_path / f"{imports}.h5")}},
                       model=torch.nn.Sequential(torch.nn.Linear(3, 2)), dataset=torch.randn(8, 3)).path
    with h5py.File(path, "r+") as f:
        cfg = yaml.safe_load(f.attrs["config"])
        cfg["imports"] = [imports] if imports else []
        f.attrs.update(kind="ghostkind", config=yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("imports", list(HOW))
def test_run_name_the_report_and_plot_say_how_to_read_the_files_kind(tmp_path, imports, capsys):
    path = ghost_file(tmp_path, imports)
    with hookrun.open_run(path) as run:
        with pytest.raises(AttributeError) as caught:
            run.ghost_table()
        assert str(caught.value) == f"'Run' object has no attribute 'ghost_table' ({HOW[imports]})"
        rows = header(run)["items"][0]["rows"]
        assert ["kind", HOW[imports]] in rows and ["kind", "ghostkind"] not in rows, rows
        capsys.readouterr()
        written = plot_run(run, tmp_path / f"figures_{imports}")
        assert f"not drawn: the pictures of the kind {HOW[imports]}\n" in capsys.readouterr().out
        assert written  # the captures are still drawn (the histogram of fc's outputs)
        np.testing.assert_equal(run.file["captures/fc/0/output"].shape, (8, 2))
