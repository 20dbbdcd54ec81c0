"""`python -m hookrun.circuits export RUN --format mib OUT --task T --model M`: MIB's run_evaluation.py scores a
folder `{T with '-' for '_'}_{M}` only if its name is a key of COL_MAPPING and skips any other without a word, so
a circuit exported under another name is never scored. Such a name is one line with the closest valid name,
before the run is read or anything written. The reference: MIB's own rule, run_evaluation.py's
`if f"{task.replace('_', '-')}_{model_name}" not in COL_MAPPING: continue`, over the names below written from
hannamw/MIB-circuit-track's MIB_circuit_track/utils.py (commit b759df3); where that repository's mirror is on
this machine, its file is read and compared too."""

from __future__ import annotations

import ast
import itertools
import subprocess
from pathlib import Path

import pytest
from edge_graph import as_mib_model
from test_circuit_formats import edges_run, make_items
from tl_models import hooked_transformer

from hookrun.circuits import main
from hookrun.errors import ConfigError
from hookrun.runner.kinds.patching.edges.formats import mib_folder

# MIB_circuit_track/utils.py (b759df34433c9e31043ba9e02908ce0bf20e894f): what run_evaluation.py's command line takes
TASKS = ["ioi", "mcqa", "arithmetic_addition", "arithmetic_subtraction", "arc_easy", "arc_challenge"]
MODELS = ["gpt2", "qwen2.5", "gemma2", "llama3", "interpbench"]
COL_MAPPING = {"ioi_gpt2", "ioi_qwen2.5", "ioi_gemma2", "ioi_llama3", "mcqa_qwen2.5", "mcqa_gemma2", "mcqa_llama3",
               "arithmetic-addition_llama3", "arithmetic-subtraction_llama3", "arc-easy_gemma2", "arc-easy_llama3",
               "arc-challenge_llama3", "ioi_interpbench"}
MIRROR = Path("/work/.mirror/hannamw+MIB-circuit-track/repo")


def scored_by_mib(task, model):
    return f"{task.replace('_', '-')}_{model}" in COL_MAPPING  # run_evaluation.py's test, verbatim


def test_exactly_the_folders_mib_scores_are_accepted():
    for task, model in itertools.product(TASKS + [t.replace("_", "-") for t in TASKS], MODELS):
        if scored_by_mib(task, model):
            assert mib_folder(task, model) == f"{task.replace('_', '-')}_{model}"
        else:
            with pytest.raises(ConfigError, match="would skip it without scoring it"):
                mib_folder(task, model)


@pytest.mark.skipif(not MIRROR.is_dir(), reason="MIB's repository is not mirrored on this machine")
def test_the_names_are_mibs_own():
    text = subprocess.run(["git", "--git-dir", str(MIRROR), "show", "b759df34433c9e31043ba9e02908ce0bf20e894f:"
                           "MIB_circuit_track/utils.py"], capture_output=True, text=True, check=True).stdout
    found = {t.targets[0].id: ast.literal_eval(t.value) for t in ast.parse(text).body
             if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)}
    assert set(found["COL_MAPPING"]) == COL_MAPPING
    assert set(found["TASKS_TO_HF_NAMES"]) == set(TASKS)


@pytest.mark.parametrize(("task", "model", "line"), [
    ("iio", "gpt2", "--task 'iio': not one of MIB's (its run_evaluation.py would skip the folder without scoring it); "
                    "did you mean ioi? choose from: ioi, mcqa, arithmetic-addition, arithmetic-subtraction, arc-easy, "
                    "arc-challenge"),
    ("ioi", "gpt-2", "--model 'gpt-2': not one of MIB's (its run_evaluation.py would skip the folder without scoring "
                     "it); did you mean gpt2? choose from: gpt2, qwen2.5, gemma2, llama3, interpbench"),
    ("mcqa", "gpt2", "--task mcqa --model gpt2: MIB scores no mcqa_gpt2 folder (its run_evaluation.py would skip it "
                     "without scoring it); MIB scores mcqa on: qwen2.5, gemma2, llama3"),
])
def test_a_name_mib_skips_is_one_line_before_anything_is_read_or_written(tmp_path, capsys, task, model, line):
    missing = tmp_path / "no_such_run.h5"  # (refused before the run is opened: its absence is not what is said)
    assert main(["export", str(missing), "--format", "mib", str(tmp_path / "sub"), "--task", task, "--model", model]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"hookrun.circuits: error: {line}"]
    assert not (tmp_path / "sub").exists()


def test_a_task_in_mibs_command_line_form_writes_mibs_folder(tmp_path, capsys, monkeypatch):
    model = hooked_transformer(40, n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=2, act_fn="gelu", seed=1)
    edges_run(model, make_items(), tmp_path / "edges.h5")
    as_mib_model(monkeypatch, tmp_path / "edges.h5", "llama3")
    assert main(["export", str(tmp_path / "edges.h5"), "--format", "mib", str(tmp_path / "sub"), "--task", "arc_easy",
                 "--model", "llama3"]) == 0
    assert [p.relative_to(tmp_path).as_posix() for p in (tmp_path / "sub").rglob("*.json")] == [
        "sub/arc-easy_llama3/importances.json"]
