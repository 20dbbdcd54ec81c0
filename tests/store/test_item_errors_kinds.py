"""An item that raises (a data set whose len() says more items than it has) in the data a kind reads
outside the record loop: probe.test_data's batches and the items patching/edges read up front. One line
naming the batch or item and the data set's len(), exit 1, no traceback. Before: a raw IndexError
traceback from probe's test pass (after the training batches were written) and from patching's load."""

from __future__ import annotations

from conftest import ENV, run_cli

NET = ["model=custom", "model._target_=odd_items.Net", "data=custom", "progress=false", "device=cpu"]


def one_line(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hookrun: error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_a_probe_test_item_that_raises_is_one_line(tmp_path):
    proc = run_cli("hydra.run.dir=run", *NET, "data.dataset._target_=odd_items.Items", "+data.dataset.form=labels",
                   "data.batch_size=4", "+probe={at: [fc], target: label, test_data: {dataset: "
                   "{_target_: odd_items.Items, form: short_labels}}}", cwd=tmp_path, env=ENV)
    line = one_line(proc)
    assert line.startswith("hookrun: error: probe.test_data: loading batch 1 (items 4..7) failed: IndexError: 5 (the "
                           "dataset's len() is 8: does it have that many items?)"), line


def test_a_patching_item_that_raises_is_one_line(tmp_path):
    proc = run_cli("hydra.run.dir=run", "experiment=edges", "data.dataset._target_=odd_items.ShortSwaps",
                   "~data.dataset.n", "~data.dataset.length", "data.batch_size=2", "progress=false", "device=cpu",
                   cwd=tmp_path, env=ENV)
    assert one_line(proc).startswith("hookrun: error: data: loading item 4 of the 6 patching reads failed: IndexError: "
                                     "list index out of range (the dataset's len() is 6: does it have that many items?)")
    assert not (tmp_path / "run" / "captures.h5").exists()


def test_an_item_that_raises_in_the_mean_baseline_is_one_line(tmp_path):
    """baseline: mean reads the whole data set (docs/attribution.md), past data.limit: item 5 raises there."""
    proc = run_cli("hydra.run.dir=run", *NET, "data.dataset._target_=odd_items.Items", "+data.dataset.form=short_labels",
                   "data.batch_size=4", "data.limit=1", "+attribution={method: saliency, target: label, baseline: mean}",
                   cwd=tmp_path, env=ENV)
    assert one_line(proc) == ("hookrun: error: attribution.baseline=mean: reading the data set's items 0..7 for its mean "
                              "input failed: IndexError: 5 (the dataset's len() is 8: does it have that many items?) "
                              "(the traceback: HYDRA_FULL_ERROR=1 or --verbose)")
    assert not (tmp_path / "run" / "captures.h5").exists()
