"""A damaged run file given to the readers (open_run, inspect, plot, report): a link table, a root
attribute or a kind's JSON attribute that HDF5 or json cannot read is one HookrunError line naming
what is damaged, exit 2 from the commands, and the file left as it was; never h5py's RuntimeError /
OSError or json's JSONDecodeError traceback (each was one, from list_captures, Run.attrs and the
kinds' readers)."""

from __future__ import annotations

import h5py
import pytest
from conftest import make_cfg
from h5_damage import damage_link_table, damage_string_attribute

import hookrun
from hookrun.errors import HookrunError

RECORD = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


@pytest.fixture(scope="module")
def clean(tmp_path_factory, checkpoint):
    return hookrun.run(make_cfg(tmp_path_factory.mktemp("clean"), checkpoint, RECORD)).path


def _commands(path, tmp_path, capsys, message, method="probes"):
    from hookrun.cli.inspect_command import main as inspect
    from hookrun.cli.plot_command import main as plot
    from hookrun.cli.report_command import main as report

    before = (path.read_bytes(), path.stat().st_mtime_ns)
    with pytest.raises(HookrunError, match=message) as info:
        getattr(hookrun.open_run(path), method)()
    assert "\n" not in str(info.value)
    for name, main, extra in (("inspect", inspect, []), ("plot", plot, ["--out", str(tmp_path / "figs")]),
                              ("report", report, ["--out", str(tmp_path / "r.html")])):
        assert main([str(path), *extra]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error: " in err and "Traceback" not in err, (name, err)
        assert message.replace("\\", "") in err.replace("(", "").replace(")", ""), (name, err)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert not (tmp_path / "r.html").exists()
    assert not (tmp_path / "figs").exists()  # (a kind's attribute too: read before any picture is written)


@pytest.mark.parametrize("group", ["captures", "captures/l"])
def test_a_damaged_link_table_is_one_line(tmp_path, clean, capsys, group):
    path = tmp_path / "damaged.h5"
    path.write_bytes(clean.read_bytes())
    damage_link_table(path, group)
    _commands(path, tmp_path, capsys, f"the group /{group} cannot be read: the file is damaged")


def test_a_damaged_root_attribute_is_one_line_at_open(tmp_path, clean, capsys):
    path = tmp_path / "damaged.h5"
    path.write_bytes(clean.read_bytes())
    damage_string_attribute(path, "config")
    _commands(path, tmp_path, capsys, f"'{path}' is damaged: bad heap pointer")


@pytest.mark.parametrize("kind, method", [("patching", "edges"), ("similarity", "similarity")])
def test_a_kind_attribute_that_is_not_json_is_one_line(tmp_path, clean, capsys, kind, method):
    """The kind's JSON attribute with bytes changed on disk (here written so by h5py: a `,` gone)."""
    path = tmp_path / "damaged.h5"
    path.write_bytes(clean.read_bytes())
    with h5py.File(path, "a") as f:
        f.attrs["kind"], f.attrs[kind] = kind, '{"method": "eap" "metric": 1}'
    _commands(path, tmp_path, capsys, f"the run's '{kind}' attribute is not JSON", method=method)


def test_a_patching_method_on_a_run_of_another_kind_is_a_hookrun_error(clean, capsys):
    """run.edges() / run.grid() on a record run: a NotFoundError (a HookrunError, so the CLI's one
    line), as run.probes() and run.similarity() are; they were a bare LookupError."""
    from hookrun.errors import NotFoundError

    run = hookrun.open_run(clean)
    with pytest.raises(NotFoundError, match=rf"{clean} holds no edge grid: run patching with method eap or eap_ig"):
        run.edges()
    with pytest.raises(NotFoundError, match=rf"no patching grid 'x': {clean} is not a patching run"):
        run.grid("x")
