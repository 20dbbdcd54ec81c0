"""Edges runs and `python -m hookrun.circuits` refuse, in one line (exit 2 on the command line), what would
lose a user's work or give a wrong number, and what used to end in a traceback or a misleading line:

- faithfulness.from naming the run's own output.path (the bounded route truncated the scores it ranks by);
- `circuits score --out` naming the source run, or an existing file without --overwrite;
- fewer than two fractions (CPR and CMD are areas: one fraction gave CPR 0, CMD 0);
- a hook that changes the forward beside an edges run (a head's writer is taken at c_proj's input: never
  saw a hook on the attention's output), before any forward;
- an attention-only HookedTransformer, before any forward (a KeyError ('mlp', 0) after the forwards);
- bad values (faithfulness.edges=10.5, run.edges(top=...)), bad circuit names, bad YAML, exports that
  cannot be written, and the memory floor's MiB figure, which must itself be enough.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import test_edges as lens_ref
import test_edges_memory as bounded_ref
from tl_models import hooked_transformer

import hookrun
from hookrun.circuits import main
from hookrun.errors import ConfigError


@pytest.fixture(scope="module")
def lens():
    return hooked_transformer(lens_ref.V, n_layers=lens_ref.L, d_model=16, n_ctx=8, d_head=4, n_heads=lens_ref.H,
                              act_fn="gelu")


@pytest.fixture
def forwards():
    """forwards(model): a counter of the model's forwards (a list that grows by one per call), removed after."""
    handles: list = []

    def count(model):
        calls: list = []
        handles.append(model.register_forward_pre_hook(lambda m, a: calls.append(1)))
        return calls
    yield count
    for h in handles:
        h.remove()


def file_run(path, model, items, overwrite=True, **block):
    return hookrun.run({"data": {"inputs": {"input": "clean"}, "target": None}, "progress": False,
                        "output": {"path": str(path), "overwrite": overwrite},
                        "patching": {"input": "input", "method": "eap", **block}}, model=model, dataset=items)


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_faithfulness_from_the_runs_own_output_is_refused_and_the_file_kept(tmp_path, lens):
    items = bounded_ref.lens_items()
    path = tmp_path / "e.h5"
    file_run(path, lens, items)
    before = hookrun.open_run(path).edges()[1].values
    memory = bounded_ref.budget_floor(lens, items, input="input", method="eap")  # the bounded route: the file opens first
    with pytest.raises(ConfigError) as err:
        file_run(path, lens, items, memory=memory, faithfulness={"edges": [5], "from": str(path)})
    assert one_line(err) == (f"output.path {str(path)!r} is patching.faithfulness.from: the run would overwrite the "
                             f"file whose scores rank the edges; write this run to another output.path")
    run = hookrun.open_run(path)
    assert run.status == "complete"
    np.testing.assert_array_equal(run.edges()[1].values, before)


def test_score_out_never_replaces_the_source_nor_an_existing_file(tmp_path, lens, capsys):
    items = bounded_ref.lens_items()
    src, other = tmp_path / "src.h5", tmp_path / "other.h5"
    file_run(src, lens, items)
    other.write_bytes(b"mine")
    stamp = src.read_bytes()
    assert main(["score", str(src), "--circuit", str(tmp_path / "c.json"), "--out", str(src), "--overwrite"]) == 2
    assert (f"--out {src} is the run being scored: the rescoring run would replace it; name another --out"
            in capsys.readouterr().err)
    assert main(["score", str(src), "--circuit", str(tmp_path / "c.json"), "--out", str(other)]) == 2
    assert (f"--out {other} exists; name another --out, or add --overwrite to replace it" in capsys.readouterr().err)
    assert src.read_bytes() == stamp and other.read_bytes() == b"mine"


def test_an_object_store_out_is_one_line_before_any_run_and_a_file_url_is_the_source(tmp_path, lens, capsys, monkeypatch):
    """`score --out s3://b/x.h5` was checked as a local Path (never existing: --overwrite was not asked, and the
    run was forced to output.overwrite=true) and `export ... s3://b/g.json` wrote ./s3:/b/g.json: both are
    refused now, as the scheme registry says what is a URL; `--out file:///SRC` is the source itself."""
    import hookrun.runner as runner

    items = bounded_ref.lens_items()
    src = tmp_path / "src.h5"
    file_run(src, lens, items)
    monkeypatch.chdir(tmp_path)
    runs = []
    monkeypatch.setattr(runner, "run", lambda cfg: runs.append(cfg))  # (score's run: never reached)
    assert main(["score", str(src), "--circuit", str(tmp_path / "c.json"), "--out", "s3://b/x.h5", "--overwrite"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "hookrun.circuits: error: --out s3://b/x.h5: an object-store URL; circuits score writes to a local path only: "
        "name one (and copy it to the store after)"]
    assert main(["score", str(src), "--circuit", str(tmp_path / "c.json"), "--out", f"file://{src}"]) == 2
    assert f"--out file://{src} is the run being scored" in capsys.readouterr().err
    assert main(["export", str(src), "--format", "eap-ig", "s3://b/g.json"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "hookrun.circuits: error: out s3://b/g.json: an object-store URL; circuits export writes to a local path only: "
        "name one (and copy it to the store after)"]
    assert not runs and sorted(p.name for p in tmp_path.iterdir()) == ["src.h5"]


def test_fewer_than_two_fractions_are_refused(lens, capsys, tmp_path):
    items = bounded_ref.lens_items()
    with pytest.raises(ConfigError) as err:
        hookrun.patch_grid(lens, items, input="input", method="eap", faithfulness={"fractions": [0.5, 0.5]})
    assert one_line(err) == ("patching.faithfulness.fractions=[0.5, 0.5]; CPR and CMD are areas under the faithfulness "
                             "curve, which need at least two fractions: give mib or a list such as [0.01, 0.1, 1]")
    assert main(["score", str(tmp_path / "x.h5"), "--circuit", str(tmp_path / "c.json"), "--fractions", "0.5"]) == 2
    assert ("--fractions 0.5: CPR and CMD are areas under the faithfulness curve, which need at least two fractions: "
            "give mib or a list such as [0.01, 0.1, 1]") in capsys.readouterr().err


@pytest.mark.parametrize("at", ["blocks.0.attn", "blocks.0.hook_mlp_out"])
def test_a_hook_that_changes_the_forward_is_refused_before_any_forward(tmp_path, lens, forwards, at):
    items = bounded_ref.lens_items()
    hooks = {"s": {"at": at, "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}}
    calls = forwards(lens)
    message = ("hooks.s: its action hooks.s.actions.0 (ModifyOutput) changes the forward, but an edges run (method eap) "
               "takes the writers' contributions where the graph taps them, which would not see the change; drop the "
               "hook, or change the model's weights instead")
    with pytest.raises(ConfigError) as err:
        hookrun.patch_grid(lens, items, hooks=hooks, input="input", method="eap")
    assert one_line(err) == message
    with pytest.raises(ConfigError) as err:
        hookrun.run({"hooks": hooks, "data": {"inputs": {"input": "clean"}, "target": None}, "progress": False,
                     "output": {"path": str(tmp_path / "h.h5")}, "patching": {"input": "input", "method": "eap"}},
                    model=lens, dataset=items)
    assert one_line(err) == message
    assert calls == [] and not (tmp_path / "h.h5").exists()


def test_an_attention_only_hooked_transformer_is_refused_before_any_forward(forwards):
    model = hooked_transformer(lens_ref.V, n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=2, attn_only=True)
    calls = forwards(model)
    with pytest.raises(ConfigError) as err:
        hookrun.patch_grid(model, bounded_ref.lens_items(), input="input", method="eap")
    assert one_line(err) == ("patching.graph=auto: the HookedTransformer is attention-only (cfg.attn_only=True), but the "
                             "residual graph has an MLP writer and reader in every layer; edges need a model with MLPs")
    assert calls == []


def test_a_gpt2_whose_layers_share_one_block_is_refused_before_any_forward(forwards):
    """transformer.h[1] = transformer.h[0] (a looped block): both layers' taps fired on each call, and eap
    ended after its forwards in 'patching: ('q', 0) is not on the metric's gradient path'."""
    from hookrun.data.swaps import word_swap

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=259, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.transformer.h[1] = model.transformer.h[0]
    calls = forwards(model)
    with pytest.raises(ConfigError) as err:
        hookrun.patch_grid(model, word_swap(n=2, length=6), method="eap")
    assert one_line(err) == ("patching.graph=auto: layers 0, 1 of GPT2LMHeadModel share one module (transformer.h.0.ln_1, "
                             "called at each of those 2 layers: a shared or looped block); the edge graph needs each "
                             "layer's own modules, so its edges are not defined")
    assert calls == []


@pytest.mark.parametrize("edges", [10.5, 2.0])
def test_a_circuit_size_that_is_not_a_whole_number_is_one_line(lens, edges):
    with pytest.raises(ConfigError) as err:
        hookrun.patch_grid(lens, bounded_ref.lens_items(), input="input", method="eap", faithfulness={"edges": edges})
    assert one_line(err) == (f"patching.faithfulness.edges={edges!r}; give circuit sizes, a list of non-negative "
                             f"integers such as [10, 50, 200]")


def test_exact_is_not_said_to_take_a_gradient(lens):
    with pytest.raises(ConfigError) as err:
        hookrun.patch_grid(lens, bounded_ref.lens_items(), input="input", method="exact", ig_steps=5,
                           sites={"r": {"at": "blocks.*.hook_resid_pre"}})
    assert one_line(err) == ("patching.ig_steps=5 with method exact: interpolation steps need method eap_ig (edges) or "
                             "atp_ig (sites); exact takes no gradient: set patching.ig_steps=null")


def test_run_edges_top_must_be_a_count(tmp_path, lens):
    path = tmp_path / "e.h5"
    file_run(path, lens, bounded_ref.lens_items())
    run = hookrun.open_run(path)
    for top in ("a", -1, True, 1.5):
        with pytest.raises(ConfigError) as err:
            run.edges(top=top)
        assert one_line(err) == (f"run.edges(top={top!r}): give how many edges to list (a whole number >= 0), "
                                 f"or None for all")
    assert len(run.edges(top=3)[0].rows) == 3 and len(run.edges(top=None)[0].rows) == np.isfinite(run.edges()[1]).sum()


def test_export_to_a_folder_or_an_unwritable_path_is_one_line(tmp_path, lens, capsys):
    path = tmp_path / "e.h5"
    file_run(path, lens, bounded_ref.lens_items())
    assert main(["export", str(path), "--format", "eap-ig", str(tmp_path)]) == 2
    assert (f"{tmp_path}: a folder; --format eap-ig writes one JSON file: name it, e.g. {tmp_path / 'graph.json'}"
            in capsys.readouterr().err)
    (tmp_path / "file").write_text("")
    assert main(["export", str(path), "--format", "eap-ig", str(tmp_path / "file" / "g.json")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'file' / 'g.json'}: cannot write (" in err and "name a writable path" in err and "Traceback" not in err


def test_score_with_bad_yaml_is_one_line(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("model: [\n")
    (tmp_path / "b.yaml").write_text("- a\n")
    assert main(["score", str(tmp_path / "a.yaml"), "--circuit", str(tmp_path / "c.json")]) == 2
    assert (f"{tmp_path / 'a.yaml'}: not valid YAML (line 2: expected the node content, but found '<stream end>'); give "
            f"a hookrun config (model:, data:, patching: ...)") in capsys.readouterr().err
    assert main(["score", str(tmp_path / "b.yaml"), "--circuit", str(tmp_path / "c.json")]) == 2
    assert (f"{tmp_path / 'b.yaml'}: holds a list, not a config mapping (model:, data:, patching: ...)"
            in capsys.readouterr().err)


@pytest.mark.parametrize("name, entry, message", [
    ("input->a0.h0<x>", {"score": 1.0}, "edge 'input->a0.h0<x>' is not in this model's graph (an edge into a head names "
     "the input it reads, a0.h0<q>, a0.h0<k> or a0.h0<v>, not 'a0.h0<x>'); fix the edge's name"),
    ("input->a0.h0", {"score": 1.0}, "edge 'input->a0.h0' is not in this model's graph (an edge into a head names the "
     "input it reads, a0.h0<q>, a0.h0<k> or a0.h0<v>, not 'a0.h0'); fix the edge's name"),
    ("input->m0<q>", {"score": 1.0}, "edge 'input->m0<q>' is not in this model's graph (an edge into 'm0' takes no <q>, "
     "<k> or <v> suffix (only a head's inputs do), not 'm0<q>'); fix the edge's name"),
    ("input->a0.h0<q>", 3.0, "edge 'input->a0.h0<q>' is 3.0, not EAP-IG's {\"score\": ..., \"in_graph\": ...}; give "
     "each edge its score in such an object"),
])
def test_circuit_edge_names_and_entries_say_what_is_wrong(tmp_path, name, entry, message):
    from hookrun.runner.kinds.patching.edges.formats import read_circuit, to_eap_ig
    from hookrun.runner.kinds.patching.edges.graph import Graph

    g = Graph(2, 2)
    doc = to_eap_ig(list(g.writers), list(g.readers), np.where(g.mask, 1.0, np.nan),
                    {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16})
    doc["edges"].pop(name, None)
    doc["edges"] = {name: entry, **doc["edges"]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        read_circuit(tmp_path / "c.json", g.writers, g.readers, g.mask)
    assert one_line(err) == f"patching.faithfulness.from={str(tmp_path / 'c.json')!r}: {message}"


def test_the_memory_floor_named_in_mib_is_enough(lens):
    from hookrun.errors import parse_bytes
    from hookrun.runner.kinds.patching.edges.bounded import _mib

    assert _mib(650160) == "0.7MiB"  # 650160 / 2**20 = 0.62: 0.6MiB (629145 bytes) is too little
    assert all(parse_bytes(_mib(n), "m") >= n for n in range(1, 3 << 20, 4099))
    items = bounded_ref.lens_items()
    with pytest.raises(ConfigError) as err:
        hookrun.patch_grid(lens, items, input="input", method="eap", memory=1)
    named = re.search(r"give at least \d+ bytes \(([\d.]+MiB)\)", str(err.value)).group(1)
    with pytest.raises(ConfigError) as err:  # the next floor (one copy's forward), not this one again
        hookrun.patch_grid(lens, items, input="input", method="eap", memory=named)
    assert "one copy of the items' forward" in str(err.value)
