"""`python -m hookrun.circuits export RUN --format eap-ig OUT`: an OUT that is the run itself, or another run's
HDF5 file, is one line and both files stay as they were (it replaced the run with the JSON)."""

from __future__ import annotations

import hashlib

from test_circuit_formats import edges_run, make_items
from tl_models import hooked_transformer

import hookrun
from hookrun.circuits import main


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_export_onto_the_run_or_another_run_is_refused(tmp_path, capsys):
    model = hooked_transformer(40, n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=2, act_fn="gelu", seed=1)
    run, other = tmp_path / "edges.h5", tmp_path / "other.h5"
    edges_run(model, make_items(), run)
    edges_run(model, make_items(3), other)
    before = {p: digest(p) for p in (run, other)}
    capsys.readouterr()

    assert main(["export", str(run), "--format", "eap-ig", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"hookrun.circuits: error: {run} is the run being exported: the JSON would replace it; "
                   f"name another file, e.g. graph.json"]
    assert main(["export", str(run), "--format", "eap-ig", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"hookrun.circuits: error: {other} is an HDF5 file (a run's?), which the JSON would replace; "
                   f"name a .json file, e.g. graph.json"]
    assert {p: digest(p) for p in (run, other)} == before
    hookrun.open_run(run).edges()  # still a run

    assert main(["export", str(run), "--format", "eap-ig", str(tmp_path / "graph.json")]) == 0


def test_score_on_a_hydra_experiment_file_says_how_to_run_it(tmp_path, capsys):
    from conftest import ROOT

    exp = ROOT / "conf" / "experiment" / "faithfulness.yaml"  # it said: Key 'defaults' not in 'HookrunConfig'; did you mean evaluate?
    assert main(["score", str(exp), "--circuit", str(tmp_path / "g.json")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"hookrun.circuits: error: {exp}: a Hydra file with defaults:, which circuits score does not compose; run it "
        f"(python -m hookrun experiment=faithfulness for conf/experiment/faithfulness.yaml) and score that run's "
        f"captures.h5, or give a whole config (model:, data:, patching: ...)"]
