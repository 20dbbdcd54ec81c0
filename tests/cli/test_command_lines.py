"""What the commands say about themselves (issue 41 items 7b and 17): `--help` points at
docs/config.md, each command's --help description is its whole first sentence, `report --out DIR`
says DIR is a directory, and a resumed run's last log line says which counts are this session's
and which the whole file's. The references are the files and the counts themselves."""

from __future__ import annotations

import logging
import re

import h5py
import pytest
from conftest import ROOT, make_cfg

import hookrun
from hookrun.cli import inspect_command, modules_command, plot_command, report_command
from hookrun.cli.usage import usage
from hookrun.errors import RunError
from hookrun.store.h5store import H5Store

RECORD = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def test_help_points_at_docs_config_md_by_its_name():
    from hookrun.cli.app import conf_dir

    text = usage(conf_dir())
    assert "docs/config.md" in text and (ROOT / "docs" / "config.md").is_file()
    assert "README's config reference" not in text  # the reference is docs/config.md, not a README section


@pytest.mark.parametrize("command", [inspect_command, modules_command, plot_command, report_command])
def test_each_commands_help_description_is_its_whole_first_sentence(command, capsys):
    with pytest.raises(SystemExit) as done:
        command.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    first = " ".join(command.__doc__.split("\n\n")[0].split())
    assert first.endswith(".") and first in text  # plot's was cut at "(PNG, matplotlib), by"


@pytest.fixture(scope="module")
def run_file(tmp_path_factory, checkpoint):
    return hookrun.run(make_cfg(tmp_path_factory.mktemp("run"), checkpoint, RECORD)).path


def test_report_out_naming_a_directory_says_so(run_file, tmp_path, capsys):
    pytest.importorskip("plotly")
    folder = tmp_path / "pages"
    folder.mkdir()
    assert report_command.main([str(run_file), "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hookrun: error: --out {folder}: that is a directory; --out names the page's file, "
                   f"e.g. --out {folder / 'report.html'}")
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(("command", "name", "out"), [(plot_command, "hookrun.plot", "s3://b/figs"),
                                                     (report_command, "hookrun.report", "s3://b/r.html")])
def test_an_object_store_out_is_one_line_not_a_local_folder_named_s3(run_file, tmp_path, capsys, monkeypatch, command,
                                                                    name, out):
    """`--out s3://b/figs` was argparse's Path('s3:/b/figs'): the figures (or the page) went to ./s3:/b/ here, silently."""
    pytest.importorskip("matplotlib" if command is plot_command else "plotly")
    monkeypatch.chdir(tmp_path)
    assert command.main([str(run_file), "--out", out]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"hookrun: error: --out {out}: an object-store URL; {name} writes to a local path only: name one (and copy it "
        f"to the store after)"]
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_runs_last_line_says_this_sessions_batches_and_the_files_samples(tmp_path, checkpoint, monkeypatch,
                                                                                   caplog):
    original = H5Store._write_capture

    def failing(self, cap, rec, *args):
        if rec.step == 1:
            raise OSError("simulated write failure")
        return original(self, cap, rec, *args)

    monkeypatch.setattr(H5Store, "_write_capture", failing)
    cfg = make_cfg(tmp_path, checkpoint, RECORD)  # 12 samples in 3 batches of 4
    with pytest.raises(RunError):
        hookrun.run(cfg)
    with h5py.File(cfg["output"]["path"]) as f:
        kept = int(f.attrs["steps_complete"])
    assert kept == 1
    monkeypatch.setattr(H5Store, "_write_capture", original)
    with caplog.at_level(logging.INFO, logger="hookrun"):
        result = hookrun.run({**cfg, "resume": True})
    with h5py.File(result.path) as f:
        steps, samples = int(f.attrs["steps_complete"]), int(f.attrs["samples_complete"])
    assert (steps, samples) == (3, 12)
    last = [r.getMessage() for r in caplog.records if r.getMessage().startswith("complete: ")][-1]
    assert re.match(rf"complete: {steps - kept} batches run now \({steps} in the file\), {samples} samples in the "
                    r"file, [\d.]+ MB in [\d.]+ s$", last), last
