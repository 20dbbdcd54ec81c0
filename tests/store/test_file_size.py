"""The plan's estimate (dry_run, output.max_bytes) against the file a run really writes, measured
with os.path.getsize: HDF5 allocates whole chunks, so the store sizes a dataset's chunks to the rows
the run can write (limit, every, the run's samples, samples x tokens) and the estimate counts the
chunks and HDF5's metadata. Uncompressed, the file is never larger than the estimate."""

from __future__ import annotations

import os
import re

import h5py
import pytest
from conftest import run_cli

import hookrun
from hookrun.errors import ConfigError
from hookrun.store import row_bound

CNN = {"_target_": "hookrun.models.tiny_cnn"}
LM = {"_target_": "hookrun.models.tiny_lm", "attn_implementation": "eager"}
TEXT = {"dataset": {"_target_": "hookrun.data.text", "max_length": 32, "padding": "longest"}, "batch_size": 4,
        "limit": 3, "store": ["input_ids", "attention_mask"]}


def shapes(size: int) -> dict:
    return {"dataset": {"_target_": "hookrun.data.shapes", "size": size}, "batch_size": 16}


def record(at: str, **kw) -> dict:
    return {"r": {"at": at, "type": "forward", "actions": [{"name": "record", "what": "output", **kw}]}}


# the repros: a 1 MiB chunk for 2 rows (8192 rows of index), 2048-row chunks for 384 token rows, every: 3
CASES = {
    "limit": (CNN, shapes(512), record("block1", limit=2)),
    "tokens": (LM, TEXT, record("transformer.h.*", rows="token")),
    "every": (CNN, shapes(64), record("block3", every=3)),
    # 512 and 2048 batches of one item: /checksums, a row per batch for each dataset the batch appends to (the capture and
    # each /samples dataset: index, step, target), is most of the file; the estimate once counted two /samples
    # datasets (under the file) and then a row per batch for the capture whose `limit` one batch reaches (over it)
    "checksums": (CNN, {**shapes(2048), "batch_size": 1}, record("fc")),
    "checksums_limit": (CNN, {**shapes(512), "batch_size": 1}, record("block1", limit=1)),
}


def cfg(tmp_path, case: str, name: str = "captures.h5", **over) -> dict:
    model, data, hooks = CASES[case]
    c = {"model": model, "data": data, "hooks": hooks, "device": "cpu", "progress": False,
         "output": {"path": str(tmp_path / name)}}
    return {**c, **over}


@pytest.mark.parametrize("case", CASES)
def test_the_estimate_is_the_written_file_size_or_a_little_more(tmp_path, case):
    dry = hookrun.run(cfg(tmp_path, case, dry_run=True))
    size = os.path.getsize(hookrun.run(cfg(tmp_path, case)).path)
    assert size <= dry.estimated_bytes <= 1.1 * size, (dry.estimated_bytes, size)


SCALE = {"s": {"at": ["block1", "block2"], "type": "forward", "actions": [
    {"name": "modify_output", "op": "scale", "factor": 0.5}, {"name": "record", "what": "output", "limit": 7}]}}
CE = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}


@pytest.mark.parametrize("ablation", [None, "zero"])
def test_an_evaluate_runs_table_is_in_the_estimate(tmp_path, ablation):
    """/evaluation (a row per batch of 5 or 9 metrics, in 1024-row chunks) was left out: the estimate
    was 18.5 KB for a 128 KB file (5 batches of a modify-only run, ablation=zero)."""
    c = cfg(tmp_path, "limit", hooks=SCALE, loss=CE, evaluate={"ablation": ablation}, data={**shapes(40), "batch_size": 8})
    dry = hookrun.run({**c, "dry_run": True})
    size = os.path.getsize(hookrun.run(c).path)
    assert size <= dry.estimated_bytes <= 1.1 * size, (dry.estimated_bytes, size)


def test_no_chunk_holds_more_rows_than_the_run_can_write(tmp_path):
    with h5py.File(hookrun.run(cfg(tmp_path, "limit", name="a.h5")).path) as f:  # limit: 2 of 512 samples
        assert f["captures/r/block1/output"].chunks[0] == 2 and f["captures/r/block1/output.index"].chunks == (2,)
        assert f["samples/index"].chunks == (512,) and f["checksums"].chunks[0] <= 32 * 5
        # (/checksums: 32 batches x 5 datasets digested: the capture, its .index, /samples index, step, target)
    with h5py.File(hookrun.run(cfg(tmp_path, "tokens", name="b.h5")).path) as f:  # 12 samples x 32 tokens
        for k in range(4):
            assert f[f"captures/r/transformer.h.{k}/output"].chunks[0] <= 12 * 32
        assert f["samples/token_sample"].chunks == (12 * 32,)
    with h5py.File(hookrun.run(cfg(tmp_path, "every", name="c.h5")).path) as f:  # batches 0 and 3 of 4
        assert f["captures/r/block3/output"].chunks[0] == 32 == f["captures/r/block3/output"].shape[0]


def test_row_bounds():
    assert row_bound(False, False, 1, None, 512, 32, 16, None) == 512
    assert row_bound(False, False, 1, 2, 512, 32, 16, None) == 2
    assert row_bound(False, False, 3, None, 64, 4, 16, None) == 32
    assert row_bound(True, False, 3, None, 64, 4, 16, None) == 2
    assert row_bound(False, True, 1, None, 12, 3, 4, 32) == 384
    assert row_bound(False, False, 1, None, None, None, None, None) is None  # unknown: chunks of CHUNK_BYTES


def test_max_bytes_refuses_a_run_whose_file_would_exceed_it(tmp_path):
    size = os.path.getsize(hookrun.run(cfg(tmp_path, "limit", name="a.h5")).path)
    with pytest.raises(ConfigError, match="exceeds output.max_bytes"):
        hookrun.run(cfg(tmp_path, "limit", name="b.h5", output={"path": str(tmp_path / "b.h5"), "max_bytes": size - 1}))
    assert not (tmp_path / "b.h5").exists()
    # the user's run: output.max_bytes=300000 let a file of 1,178,952 bytes through
    ok = hookrun.run(cfg(tmp_path, "limit", name="c.h5", output={"path": str(tmp_path / "c.h5"), "max_bytes": 300_000}))
    assert os.path.getsize(ok.path) <= 300_000


def test_top_examples_tables_and_their_state_are_in_the_estimate_and_max_bytes_refuses_them(tmp_path):
    """top_examples writes features x k at the end and the same again (twice: two slots) under /state:
    a run of 12 samples x up to 32 tokens with k=300 of 128 features (about 2 MiB)."""
    top = {"t": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "top_examples", "k": 300}]}}

    def run(name: str, dry_run: bool = False, **output):
        return hookrun.run({"model": LM, "data": TEXT, "hooks": top, "device": "cpu", "progress": False, "dry_run": dry_run,
                            "output": {"path": str(tmp_path / name), "flush_every": 1, **output}})

    dry = run("a.h5", dry_run=True)
    size = os.path.getsize(run("a.h5").path)
    with h5py.File(tmp_path / "a.h5") as f:  # both slots of the state were written (three flushes)
        assert f["captures/t/transformer.h.1/top.values"].shape == (128, 300) and len(f["state"][next(iter(f["state"]))]) == 2
    assert size > 128 * 300 * 20 * 3  # the tables and two slots of state
    assert size <= dry.estimated_bytes <= 1.1 * size, (dry.estimated_bytes, size)
    with pytest.raises(ConfigError, match="exceeds output.max_bytes"):
        run("b.h5", max_bytes=size - 1)
    assert not (tmp_path / "b.h5").exists()


@pytest.mark.slow
def test_shapes_gradcam_from_the_cli(tmp_path):
    args = ("experiment=shapes_gradcam", "progress=false", f"hydra.run.dir={tmp_path / 'g'}")
    dry = run_cli(*args, "dry_run=true", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    estimate = int(re.search(r"estimated file size: .* \((\d+) bytes uncompressed, in whole HDF5 chunks", dry.stdout)[1])
    real = run_cli(*args, cwd=tmp_path)
    assert real.returncode == 0, real.stderr
    size = os.path.getsize(tmp_path / "g" / "captures.h5")
    assert size <= estimate <= 1.1 * size, (estimate, size)


def test_a_spliced_saes_evaluation_columns_and_state_are_in_the_estimate(tmp_path):
    """Each splice adds l0, mse, explained_variance, dead_fraction per batch and its statistics'
    state (sums, sum_x of d_in, fired of d_sae) under /evaluation/splices: all in the estimate."""
    import json

    import torch
    from lm_runs import lm_cfg

    safetensors = pytest.importorskip("safetensors.torch")
    folder = tmp_path / "sae"
    folder.mkdir()
    g = torch.Generator().manual_seed(1)
    safetensors.save_file({"W_enc": torch.randn(32, 48, generator=g), "W_dec": torch.randn(48, 32, generator=g),
                           "b_enc": torch.zeros(48), "b_dec": torch.zeros(32)}, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": 32, "d_sae": 48, "dtype": "float32",
                                                 "apply_b_dec_to_input": True, "normalize_activations": "none"}))
    hooks = {"sae": {"at": "transformer.h.0", "type": "forward",
                     "actions": [{"name": "modify_output", "op": "splice", "path": str(folder)}]}}
    c = lm_cfg(tmp_path, hooks, {"ablation": "zero"})
    dry = hookrun.run({**c, "dry_run": True})
    size = os.path.getsize(hookrun.run(c).path)
    assert size <= dry.estimated_bytes <= 1.1 * size, (dry.estimated_bytes, size)


class ManyClasses:
    """8 shapes-sized images, the data set naming 1000 classes (written as the class_names attribute)."""

    classes = [f"class number {i} with a fairly long descriptive name" for i in range(1000)]

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        import torch

        return torch.full((1, 32, 32), float(i)), i % 4


def test_the_class_names_attribute_is_in_the_estimate(tmp_path):
    """The data set's class names (53 KB of JSON here) were left out: estimate 59895 B, file 112856 B."""
    c = cfg(tmp_path, "limit", data={"batch_size": 4})
    dry = hookrun.run({**c, "dry_run": True}, dataset=ManyClasses())
    size = os.path.getsize(hookrun.run(c, dataset=ManyClasses()).path)
    assert size <= dry.estimated_bytes <= 1.1 * size, (dry.estimated_bytes, size)


def test_a_kind_whose_rows_are_not_batches_refuses_max_bytes_and_its_dry_run_says_what_is_left_out(tmp_path):
    """A patching grid's cells (and an SAE run's training steps: RunKind.estimated) are not in the estimate,
    which counted the data's items: experiment=patching_grid output.max_bytes=20KB ran and wrote 37,336 bytes
    against an estimate of 15,645. Now max_bytes is refused in one line and the dry run names what it leaves out."""
    over = ["experiment=patching_grid", "data.dataset.n=2", "data.dataset.length=8", "progress=false"]
    bad = run_cli(*over, "output.max_bytes=20KB", f"hydra.run.dir={tmp_path / 'run'}")
    assert bad.returncode == 2 and not (tmp_path / "run" / "captures.h5").exists(), bad.stderr[-2000:]
    assert ("output.max_bytes: the estimate leaves out the patching run's cells, so it would not bound the file; "
            "drop output.max_bytes (dry_run=true shows what it counts)") in bad.stderr
    dry = run_cli(*over, "dry_run=true", f"hydra.run.dir={tmp_path / 'dry'}")
    assert dry.returncode == 0 and "; not counted: the patching run's cells" in dry.stdout, dry.stderr[-2000:]
    plain = run_cli(*over, f"hydra.run.dir={tmp_path / 'plain'}")  # the grid's file: larger than the estimate
    est = int(re.search(r"estimated file size: .*?\((\d+) bytes uncompressed", dry.stdout).group(1))
    assert plain.returncode == 0 and os.path.getsize(tmp_path / "plain" / "captures.h5") > est
