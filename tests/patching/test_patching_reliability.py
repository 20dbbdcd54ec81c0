"""Patching's silent wrong numbers and tracebacks (issue 41 items 1-7): each grid compared with a
one-cell-at-a-time loop of raw forward hooks; each bad input one ConfigError before any forward,
the model unchanged."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

import hookrun
from hookrun.errors import ConfigError

T, V = 5, 10


class Net(nn.Module):
    """A small stack: embedding, two linear blocks with a causal mix, head. `embed_first` decides
    only the order the attributes are registered in (the forward is the same); `repeat_first`
    runs block 0 a second time at the end (its order cannot be a stack's)."""

    def __init__(self, embed_first: bool, repeat_first: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        e, b = nn.Embedding(V, 8), nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        if embed_first:
            self.e, self.b = e, b
        else:
            self.b, self.e = b, e
        self.h = nn.Linear(8, V)
        self.repeat_first = repeat_first

    def forward(self, input_ids):
        x = self.e(input_ids)
        for layer in self.b:
            x = x + layer(x).cumsum(1)
        if self.repeat_first:
            x = x + self.b[0](x)
        return self.h(x)


def make_items(n=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    clean, corrupt = torch.randint(0, V, (n, T), generator=g), torch.randint(0, V, (n, T), generator=g)
    ans, wrong = torch.randint(0, V, (n,), generator=g), torch.randint(0, V, (n,), generator=g)
    return clean, corrupt, ans, wrong, [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i], "wrong": wrong[i]}
                                        for i in range(n)]


def raw_loop(model, module, clean, corrupt, metric):
    """metric(model(corrupt)) with module's output at position p taken from the clean run, one p at a time."""
    with torch.no_grad():
        kept = {}
        h = module.register_forward_hook(lambda m, a, o: kept.setdefault("x", o.detach().clone()))
        model(clean)
        h.remove()
        out = []
        for p in range(T):
            def patch(m, a, o, p=p):
                o = o.clone()
                o[:, p] = kept["x"][:, p]
                return o
            h = module.register_forward_hook(patch)
            out.append(float(metric(model(corrupt)).double().mean()))
            h.remove()
    return np.array(out)


def logit_diff(ans, wrong):
    r = torch.arange(len(ans))
    return lambda logits: logits[r, -1, ans] - logits[r, -1, wrong]


@pytest.fixture(scope="module")
def task():
    return make_items()


@pytest.mark.parametrize("embed_first", [True, False])
@pytest.mark.parametrize("repeat_first", [False, True])
def test_the_stack_comes_from_the_forward_not_the_registration_order(task, embed_first, repeat_first):
    clean, corrupt, ans, wrong, items = task
    model = Net(embed_first, repeat_first).eval()
    sites = {"e": {"at": "e", "over": ["position"]}, "b1": {"at": "b.1", "over": ["position"]},
             "h": {"at": "h", "over": ["position"]}}
    g = hookrun.patch_grid(model, items, sites=sites, cells_per_forward=3)
    metric = logit_diff(ans, wrong)
    for name, module in (("e", model.e), ("b1", model.b[1]), ("h", model.h)):
        np.testing.assert_allclose(g[name].values[0], raw_loop(model, module, clean, corrupt, metric), atol=1e-5,
                                   err_msg=name)


@pytest.fixture(scope="module")
def net():
    return Net(True).eval()


@pytest.mark.parametrize(("block", "message"), [
    ({"metric": {"position": 50}}, r"patching.metric.position=50: outside the sequence; the output has 5 position\(s\): 0..4, or -5..-1"),
    ({"metric": {"position": -6}}, r"patching.metric.position=-6: outside the sequence"),
    ({"metric": {"position": "pos"}}, r"patching.metric.position='pos': item 1 asks for position 9; the output has 5"),
    ({"metric": {"answer": "big"}}, r"patching.metric.answer='big': item 0 has id 99, outside the model's 10 output classes \(0..9\)"),
    ({"metric": {"wrong": "neg"}}, r"patching.metric.wrong='neg': item 0 has id -1, outside"),
    ({"metric": {"normalize": "maybe"}}, r"patching.metric: normalize='maybe' is not a boolean; give true or false"),
    ({"sites": [{"at": "e"}]}, r"patching.sites: got a list; give a mapping of site names to sites"),
    ({"input": "input"}, r"patching.input='input' is not an argument of Net.forward, which takes input_ids; .*did you mean input_ids"),
    ({"limit": -1}, r"patch_grid: limit=-1; give how many items to use"),
    ({"which": "exct"}, r"patch_grid: which='exct'; choose from: value, exact; did you mean exact"),
    ({"memory": "1.2.3"}, r"patching.memory='1.2.3'; give bytes as a number or with a unit"),
    ({"memory": "."}, r"patching.memory='.'; give bytes"),
])
def test_bad_inputs_are_one_line_before_any_forward(net, task, block, message):
    *_, items = task
    items = [{**it, "pos": torch.tensor(9 * i), "big": torch.tensor(99), "neg": torch.tensor(-1)} for i, it in enumerate(items)]
    block = {"sites": {"e": {"at": "e", "over": ["position"]}}, **block}
    if "metric" in block:
        block["metric"] = {"name": "logit_diff", **block["metric"]}
    calls = []
    h = net.h.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
    net.train()
    try:
        with pytest.raises(ConfigError, match=message):
            hookrun.patch_grid(net, items, **block)
    finally:
        h.remove()
    assert len(calls) <= 2  # at most the clean and corrupted base runs, never a cell
    assert net.training  # the model comes back as it went in
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules())
    net.eval()


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("no", False), ("off", False), (0, False), (False, False),
                                                   ("true", True), ("yes", True), (1, True), (True, True)])
def test_normalize_is_read_strictly(net, task, value, expected):
    clean, corrupt, ans, wrong, items = task
    g = hookrun.patch_grid(net, items, metric={"name": "logit_diff", "normalize": value},
                           sites={"e": {"at": "e", "over": ["position"]}})["e"]
    raw = raw_loop(net, net.e, clean, corrupt, logit_diff(ans, wrong))
    with torch.no_grad():
        m_clean, m_corrupt = (float(logit_diff(ans, wrong)(net(x)).double().mean()) for x in (clean, corrupt))
    want = (raw - m_corrupt) / (m_clean - m_corrupt) if expected else raw
    assert g.attrs["normalize"] is expected
    np.testing.assert_allclose(g.values[0], want, atol=1e-5)


def test_normalize_with_equal_clean_and_corrupted_metrics_is_refused(net, task):
    *_, items = task
    same = [{**it, "corrupt": it["clean"]} for it in items]
    with pytest.raises(ConfigError, match=r"patching.metric.normalize: the metric is .* on the clean input and .* on the "
                                          r"corrupted one, so .* is undefined"):
        hookrun.patch_grid(net, same, metric={"name": "logit_diff", "normalize": True}, sites={"e": {"at": "e", "over": ["position"]}})


def nan_for_item_one(logits, items):
    """logits[-1, answer] per item, NaN for every third item (a metric that fails for some items)."""
    r = torch.arange(logits.shape[0])
    out = logits[r, -1, items["answer"].long()].clone()
    out[1::3] = float("nan")
    return out


def test_nan_cells_are_warned_naming_the_site_and_cells(net, task, caplog):
    *_, items = task
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        g = hookrun.patch_grid(net, items, metric=nan_for_item_one, sites={"e": {"at": "e", "over": ["position"]}})
    assert np.isnan(g["e"].values).all()
    lines = [r.getMessage() for r in caplog.records if "NaN" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("patching.sites.e: 5 of 5 cell(s) are NaN"), lines
    assert "e position 0; e position 1" in lines[0]


def test_a_python_function_is_a_metric(net, task):
    clean, corrupt, ans, wrong, items = task

    def last_answer(logits, batch):  # one value per item
        return logits[torch.arange(logits.shape[0]), -1, batch["answer"].long()]

    g = hookrun.patch_grid(net, items, metric=last_answer, sites={"e": {"at": "e", "over": ["position"]}})["e"]
    r = torch.arange(len(ans))
    np.testing.assert_allclose(g.values[0], raw_loop(net, net.e, clean, corrupt, lambda lg: lg[r, -1, ans]), atol=1e-5)
    assert g.attrs["metric"].endswith("last_answer")
    norm = hookrun.patch_grid(net, items, metric={"name": last_answer, "normalize": True}, sites={"e": {"at": "e", "over": ["position"]}})
    assert norm["e"].attrs["normalize"] is True


@pytest.mark.parametrize("method", ["exact", "eap"])
def test_a_metric_that_raises_is_one_line_naming_it(method):
    """A metric of the user's own that raises (a key its items lack) is one RunError line naming the metric and
    the exception, as a loss or a model's forward that raises is (it was the metric's traceback, from the CLI too)."""
    from edge_graph import prompt_pairs

    from hookrun.errors import RunError
    from hookrun.models.tiny_lm import tiny_lm

    def needs_label(logits, batch):
        return logits[:, -1, batch["label"]]

    model, items = tiny_lm(), prompt_pairs(259, 6, seed=1, at=2, shift=7, n=2)
    sites = {"sites": {"e": {"at": "transformer.h.0", "over": ["position"]}}} if method == "exact" else {}
    with pytest.raises(RunError) as err:
        hookrun.patch_grid(model, items, method=method, metric=needs_label, **sites)
    line = str(err.value)
    assert "\n" not in line and line.startswith("patching.metric "), line
    assert "needs_label(logits, items) raised KeyError: 'label'" in line, line


def test_ragged_clean_inputs_are_one_line_naming_the_lengths(net):
    items = [{"clean": torch.arange(5), "corrupt": torch.arange(5), "answer": torch.tensor(1), "wrong": torch.tensor(2)},
             {"clean": torch.arange(4), "corrupt": torch.arange(4), "answer": torch.tensor(1), "wrong": torch.tensor(2)}]
    with pytest.raises(ConfigError, match=r"patching.clean: the items' 'clean' differ in shape: item 0 has \(5,\), item 1 "
                                          r"\(4,\); patching stacks the items into one batch: pad them to one length"):
        hookrun.patch_grid(net, items, sites={"e": {"at": "e", "over": ["position"]}})


class Mix(nn.Module):
    """Attention without heads: softmax(x x^T * 3) x; `override(pattern)` replaces the pattern (the reference's seam)."""

    def __init__(self) -> None:
        super().__init__()
        self.override = None

    def forward(self, x):
        pattern = torch.softmax(x @ x.transpose(-1, -2) * 3, dim=-1)
        if self.override is not None:
            pattern = self.override(pattern)
        return pattern @ x


class MixNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.e, self.a, self.h = nn.Embedding(V, 8), Mix(), nn.Linear(8, V)

    def forward(self, input_ids):
        return self.h(self.a(self.e(input_ids)))


@pytest.mark.parametrize("at", ["a/softmax", "a/softmax.0"])
def test_an_op_site_spelt_as_capture_takes_it_is_patched(task, at):
    clean, corrupt, ans, wrong, items = task
    model = MixNet().eval()
    g = hookrun.patch_grid(model, items, sites={"p": {"at": at, "over": ["query"], "dims": ["sample", "query", "key"]}})["p"]
    assert list(g.module.values) == ["a/softmax.0"]
    with torch.no_grad():  # the reference: the pattern's row q replaced by the clean run's, one q at a time
        kept = {}
        model.a.override = lambda pat: kept.setdefault("p", pat)
        model(clean)
        ref = []
        for q in range(T):
            def swap(pat, q=q):
                pat = pat.clone()
                pat[:, q] = kept["p"][:, q]
                return pat
            model.a.override = swap
            ref.append(float(logit_diff(ans, wrong)(model(corrupt)).double().mean()))
        model.a.override = None
    assert np.ptp(ref) > 1e-3
    np.testing.assert_allclose(g.values[0], ref, atol=1e-5)


def test_patching_input_alone_sends_the_inputs_to_the_forward(tmp_path, net, task):
    clean, corrupt, ans, wrong, items = task
    cfg = {"progress": False, "output": {"path": str(tmp_path / "p.h5")},
           "patching": {"input": "input_ids", "sites": {"e": {"at": "e", "over": ["position"]}}}}
    hookrun.run(cfg, model=net, dataset=items)  # no data.inputs: {input_ids: clean} is the patching block's
    grid = hookrun.open_run(tmp_path / "p.h5").grid("e")
    np.testing.assert_allclose(grid.values[0], raw_loop(net, net.e, clean, corrupt, logit_diff(ans, wrong)), atol=1e-5)


def test_a_grid_without_xarray_names_the_extra(monkeypatch):
    import sys

    from hookrun.errors import HookrunError
    from hookrun.runner.kinds.patching.reader import as_grid

    monkeypatch.setitem(sys.modules, "xarray", None)  # import xarray raises ModuleNotFoundError
    layout = {"e": {"modules": ["e"], "over": ["position"], "sizes": [2], "offset": 0, "dims": ["sample", "position"]}}
    with pytest.raises(HookrunError, match=r"needs xarray: pip install 'hookrun\[xarray\]'"):
        as_grid("e", np.zeros(2), layout, {})


@pytest.mark.slow
def test_bad_values_in_an_experiment_file_are_one_line_from_the_cli(tmp_path):
    from conftest import run_cli

    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    (tmp_path / "extra" / "experiment" / "bad.yaml").write_text(
        "# @package _global_\ndefaults:\n  - patching_grid\npatching:\n  cells_per_forward: abc\n")
    proc = run_cli(f"hydra.searchpath=[file://{tmp_path / 'extra'}]", "experiment=bad", cwd=tmp_path)
    assert proc.returncode == 2
    # (the block's slot is untyped in Hydra's schema: load() types it, before anything is built)
    assert proc.stderr.strip() == "hookrun: error: patching.cells_per_forward=abc is not a whole number; give an integer"
    proc = run_cli("experiment=patching_grid", "patching.memory=1.2.3", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == "hookrun: error: patching.memory='1.2.3'; give bytes as a number or with a unit (512MB, 2GiB)"
    assert "Traceback" not in proc.stderr + proc.stdout
    proc = run_cli("experiment=patching_grid", "patching.metric.position=50", "data.dataset.n=2", "data.dataset.length=8",
                   "hydra.run.dir=out", "progress=false", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == ("hookrun: error: patching.metric.position=50: outside the sequence; the output has 8 "
                                   "position(s): 0..7, or -8..-1 from the end")
    assert not list((tmp_path / "out").glob("*.h5"))  # no file, no failed file
