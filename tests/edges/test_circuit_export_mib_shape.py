"""`circuits export --format mib --model M` writes a graph of model M's shape only: MIB's run_evaluation.py builds
the graph from the file's cfg and evaluates it on its own model named M (gpt2-small, Qwen2.5-0.5B, Gemma-2-2B,
Llama-3.1-8B, InterpBench's IOI model). A 2-layer, 2-head run was written as ioi_gpt2/importances.json, 'wrote ...
(53 edges, ...)', without a word; now it is one line naming both shapes, exit 2, and nothing is written.

The reference shapes are MIB's own files where its repository is mirrored here: its shipped GPT-2 IOI circuit
(circuits/ioi-eap-ig.json, EAP-IG's cfg) and the InterpBench graph printed in attribute_interpbench.ipynb."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_circuit_formats import edges_run, make_items
from tl_models import hooked_transformer

from hookrun.circuits import main
from hookrun.errors import ConfigError
from hookrun.runner.kinds.patching.edges.formats import MIB_SHAPES, check_mib_shape

MIRROR = Path("/work/.mirror/hannamw+MIB-circuit-track/repo")
COMMIT = "b759df34433c9e31043ba9e02908ce0bf20e894f"


def mib_file(path):
    return subprocess.run(["git", "--git-dir", str(MIRROR), "show", f"{COMMIT}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def test_a_run_of_another_shape_is_refused_and_nothing_written(tmp_path, capsys):
    model = hooked_transformer(40, n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=2, act_fn="gelu", seed=1)
    edges_run(model, make_items(), tmp_path / "edges.h5")
    for name, shape in (("gpt2", "12 layers, 12 heads, d_model 768"), ("llama3", "32 layers, 32 heads, d_model 4096")):
        assert main(["export", str(tmp_path / "edges.h5"), "--format", "mib", str(tmp_path / "sub"), "--task", "ioi",
                     "--model", name]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"hookrun.circuits: error: --model {name}: the run's graph (2 layers, 2 heads, d_model 16) is not "
                       f"{name}'s ({shape}), which MIB evaluates the folder on; export an edges run of that model (MIB's "
                       f"models: gpt2, qwen2.5, gemma2, llama3, interpbench)"]
        assert not (tmp_path / "sub").exists()


def test_a_run_of_interpbenchs_shape_is_named_and_written_under_its_name(tmp_path, capsys):
    model = hooked_transformer(40, n_layers=6, d_model=8, n_ctx=8, d_head=2, n_heads=4, act_fn="gelu", seed=1)
    edges_run(model, make_items(), tmp_path / "edges.h5")
    assert main(["export", str(tmp_path / "edges.h5"), "--format", "mib", str(tmp_path / "sub"), "--task", "ioi",
                 "--model", "gpt2"]) == 2
    assert capsys.readouterr().err.strip().endswith("its shape is interpbench's: give --model interpbench")
    assert main(["export", str(tmp_path / "edges.h5"), "--format", "mib", str(tmp_path / "sub"), "--task", "ioi",
                 "--model", "interpbench"]) == 0
    assert (tmp_path / "sub" / "ioi_interpbench" / "importances.json").is_file()


@pytest.mark.skipif(not MIRROR.is_dir(), reason="MIB's repository is not mirrored on this machine")
def test_the_shapes_are_mibs_own():
    cfg = json.loads(mib_file("circuits/ioi-eap-ig.json"))["cfg"]  # MIB's own GPT-2 IOI circuit
    assert (cfg["n_layers"], cfg["n_heads"], cfg["d_model"], cfg["parallel_attn_mlp"]) == (*MIB_SHAPES["gpt2"], False)
    check_mib_shape(cfg, "gpt2")
    for other in ("qwen2.5", "gemma2", "llama3", "interpbench"):
        with pytest.raises(ConfigError, match=f"^--model {re.escape(other)}: the run's graph \\(12 layers, 12 heads"):
            check_mib_shape(cfg, other)
    nodes = set(re.findall(r"\ba(\d+)\.h(\d+)\b", mib_file("attribute_interpbench.ipynb")))
    layers, heads = max(int(n) for n, _ in nodes) + 1, max(int(h) for _, h in nodes) + 1
    assert (layers, heads) == MIB_SHAPES["interpbench"][:2] and len(nodes) == layers * heads
