"""Items that disagree about having a target, or fail to load, or give targets of two shapes: one
line naming the batch (or samples) and what is right, exit 1, and a file that does not say
`complete`. References: the dataset's own items read directly (their labels), h5py on the file.
Before: /samples/target was short or back-filled with class 0 in a `complete` file, an item that
raised gave an 89-line traceback, the target-shape line named batch 0 and data.padding."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import ENV, run_cli
from odd_items import Items, Net

import hookrun
from hookrun.errors import RunError

ARGS = ["model=custom", "model._target_=odd_items.Net", "data=custom", "data.dataset._target_=odd_items.Items",
        "hooks={h: {at: fc, type: forward}}", "progress=false", "device=cpu"]


def cli(tmp_path, form: str, *extra: str):
    proc = run_cli("hydra.run.dir=run", *ARGS, f"+data.dataset.form={form}", *extra, cwd=tmp_path, env=ENV)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hookrun: error:")]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        assert f.attrs["status"] != "complete"
        kept = f["samples/index"][:]
        if "target" in f["samples"]:
            assert len(f["samples/target"]) == len(kept)
    return lines[0], kept


def run_items(tmp_path, form: str, batch_size: int):
    return hookrun.run({"hooks": {"h": {"at": "fc", "type": "forward"}}, "data": {"batch_size": batch_size},
                        "progress": False, "output": {"path": str(tmp_path / f"{form}{batch_size}.h5")}},
                       model=Net(), dataset=Items(form))


@pytest.mark.slow
@pytest.mark.parametrize("form, now", [("late_label", "has a target, the batches before it had none"),
                                       ("lost_label", "has no target, the batches before it had one")])
def test_a_target_that_comes_or_goes_between_batches_is_refused(tmp_path, form, now):
    line, kept = cli(tmp_path, form, "data.batch_size=4")
    assert f"/samples/target: batch 1 (samples 4..7) {now}" in line and "data.target=null" in line
    assert kept.tolist() == [0, 1, 2, 3]  # batch 0 stays readable; batch 1 was never written


@pytest.mark.parametrize("form, first, other", [("late_label", "a dict of x", "a dict of label, x"),
                                                ("lost_label", "a tuple of 2", "a dict of x")])
def test_items_of_one_batch_that_disagree_are_refused_before_the_forward(tmp_path, form, first, other):
    for size, lo in ((8, 0), (3, 3)):  # (3: batch 1 holds samples 3, 4, 5)
        with pytest.raises(RunError) as err:
            run_items(tmp_path, form, size)
        assert f"sample {lo} is {first}, sample 4 is {other}" in str(err.value)
        assert "\n" not in str(err.value)
        with h5py.File(tmp_path / f"{form}{size}.h5") as f:
            assert f.attrs["status"] == "failed" and len(f["samples/index"]) == (0 if size == 8 else 3)


def test_consistent_labels_are_written_as_the_items_give_them(tmp_path):
    r = run_items(tmp_path, "labels", 3)
    items = Items("labels")
    with h5py.File(r.path) as f:
        assert f.attrs["status"] == "complete"
        np.testing.assert_array_equal(f["samples/target"][:], [items[i]["label"] for i in f["samples/index"][:]])
        assert f["samples/index"][:].tolist() == list(range(8))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_an_item_that_raises_is_one_line(tmp_path, workers):
    line, kept = cli(tmp_path, "raises", "data.batch_size=4", f"data.num_workers={workers}")
    assert line == ("hookrun: error: data: loading batch 1 (items 4..7) failed: KeyError: 'bad item 6' "
                    "(the traceback: HYDRA_FULL_ERROR=1 or --verbose)")
    assert kept.tolist() == [0, 1, 2, 3]


def test_an_item_that_raises_before_the_run_is_one_line(tmp_path):
    """Every run's checks (and the estimate, early_stop's probe, the kinds' preflights) read the first
    items before any batch: an item that raised there was the dataset's own traceback."""
    for dry in (True, False):
        with pytest.raises(RunError) as err:
            hookrun.run({"hooks": {"h": {"at": "fc", "type": "forward"}}, "dry_run": dry, "progress": False,
                         "output": {"path": str(tmp_path / "dry.h5")}}, model=Net(), dataset=Items("raises_first"))
        assert str(err.value) == ("data: loading the first 1 item(s) before the run failed: KeyError: 'bad item 0' "
                                  "(the traceback: HYDRA_FULL_ERROR=1 or --verbose)")
        assert isinstance(err.value.__cause__, KeyError) and not (tmp_path / "dry.h5").exists()


def test_a_len_larger_than_the_items_is_one_line(tmp_path):
    with pytest.raises(RunError, match=r"^data: loading batch 1 \(items 4\.\.7\) failed: IndexError: 5 \(the dataset's "
                                       r"len\(\) is 8: does it have that many items\?\)"):
        run_items(tmp_path, "short", 4)


def test_targets_of_two_shapes_name_the_batch_and_the_targets(tmp_path):
    with pytest.raises(RunError) as err:
        run_items(tmp_path, "target_shape", 4)
    assert str(err.value) == ("/samples/target: batch 1 has rows of shape (2,), earlier batches (); "
                              "every item's target must have one shape")
