"""The HTML report in a real browser: headless Chromium (Debian's chromium + chromedriver, driven by
selenium) with the network blocked, on reports of shipped experiments: an attention run, an SAE
splice (evaluation, latents, top examples where the file has them) and an evaluated sweep.

Each page must log no console error, hold every section its file calls for, load nothing from the
network, show under the pointer the value h5py reads from the file, and list the file's top
examples. Missing chromium, chromedriver or selenium FAILS these tests (CI installs them: .ci/run).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT, run_cli
from headless_browser import chromium, open_page, sections
from warm_python import python as warm

import hookrun

pytestmark = pytest.mark.slow
FAST = ["device=cpu", "progress=false"]
browser = pytest.fixture(scope="module")(chromium)  # headless Chromium, no network


def hover(driver, plot, col: int, row: int) -> str:
    """Move the pointer over heatmap cell (row, col) of a plotly div; the hover label's text."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
    x, y, w, h = driver.execute_script(
        "const gd = arguments[0], fl = gd._fullLayout, r = gd.getBoundingClientRect();"
        "return [fl.xaxis._offset + fl.xaxis.l2p(arguments[1]), fl.yaxis._offset + fl.yaxis.l2p(arguments[2]), r.width, r.height];",
        plot, col, row)
    ActionChains(driver).move_to_element_with_offset(plot, int(x - w / 2), int(y - h / 2)).perform()
    for _ in range(30):
        text = driver.execute_script("const t = arguments[0].querySelector('.hoverlayer .hovertext'); return t ? t.textContent : ''", plot)
        if text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"no hover label over cell ({row}, {col})")


def report(path: Path, *extra: str) -> Path:
    proc = warm(["-m", "hookrun.report", str(path), *extra], cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = Path(proc.stdout.split("wrote ", 1)[1].split(" (", 1)[0])
    assert out.is_file() and out.stat().st_size < 20e6
    return out


def page_data(driver) -> dict:
    return driver.execute_script("return JSON.parse(document.getElementById('hookrun-data').textContent)")


def test_attention_report_hover_shows_the_files_value(browser, tmp_path):
    run = tmp_path / "attn"
    cfg = hookrun.compose("experiment=gpt2_attention", "data.limit=1", f"output.path={run / 'captures.h5'}", *FAST)
    hookrun.run(cfg)
    page = report(run)
    assert page == run / "report.html"
    open_page(browser, page)
    assert sections(browser) == ["section-header", "section-captures", "section-attention"]
    item = next(i for s in page_data(browser)["sections"] if s["id"] == "attention" for i in s["items"])
    key = item["key"]
    plots = browser.find_elements("css selector", "#section-attention .plot")
    assert len(plots) >= 4  # 4 heads of a sample
    with h5py.File(run / "captures.h5") as f:
        expected = f[key["capture"]][key["row"]][0]  # head 0 of the first sample: (query, key)
        ids = f["samples/input_ids"][key["row"]]
    ticks = browser.execute_script("return Array.from(arguments[0].querySelectorAll('.xtick text')).map(t => t.textContent)", plots[0])
    tokens = ["<bos>" if ids[k] == 1 else chr(ids[k] - 3).replace(" ", "␣") for k in key["keys"][:6]]
    assert ticks[:6] == tokens  # each key's own text labels the axis, "<bos>" shown as written
    for row, col in ((0, 0), (len(key["queries"]) - 1, len(key["keys"]) - 1), (5, 2)):
        text = hover(browser, plots[0], col, row)
        shown = float(re.search(r"output: ([-0-9.e+]+)", text).group(1))
        assert shown == pytest.approx(float(expected[key["queries"][row], key["keys"][col]]), rel=1e-5, abs=1e-7), text


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory) -> Path:
    import safetensors.torch

    folder = tmp_path_factory.mktemp("h3")
    g = torch.Generator().manual_seed(0)
    d, n = 128, 64
    safetensors.torch.save_file({"W_enc": torch.randn(d, n, generator=g) * 0.1, "W_dec": torch.randn(n, d, generator=g) * 0.1,
                                 "b_enc": torch.zeros(n), "b_dec": torch.zeros(d)}, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": d, "d_sae": n, "dtype": "float32",
                                                 "apply_b_dec_to_input": True, "normalize_activations": "none",
                                                 "metadata": {"hook_name": "transformer.h.3"}}))
    return folder


def test_sae_report_shows_evaluation_latents_and_the_files_top_examples(browser, tmp_path, sae_dir):
    run = tmp_path / "sae"
    over = [f"params.sae={sae_dir}", "data.dataset.limit=16", "data.batch_size=8", f"output.path={run / 'captures.h5'}", *FAST]
    top = ["hooks.latents.actions=[{name: record, what: output, rows: token, dtype: float16}, {name: top_examples, k: 5, context: 6}]"]
    hookrun.run(hookrun.compose("experiment=sae_eval", *over, *top))
    page = report(run)
    open_page(browser, page)
    found = sections(browser)
    assert found == ["section-header", "section-evaluation", "section-captures", "section-latents"]
    with hookrun.open_run(run) as r:
        table = r.evaluation()
        modules = dict(getattr(r, "top_example_modules", None) or {})
        shown_cells = browser.execute_script("return Array.from(document.querySelectorAll('#section-evaluation td')).map(t => t.textContent)")
        assert f"{table.rows[0]['ce_clean']:.6g}" in shown_cells
        assert list(modules) == ["transformer.h.3.sae.latents"]
        module = next(iter(modules))
        items = browser.find_elements("css selector", "#section-latents .latent-list li")
        with h5py.File(run / "captures.h5", "r", locking=False) as f:
            latents = f["captures/latents/transformer.h.3.sae.latents/output"][:]
            token_sample, token_position = f["samples/token_sample"][: len(latents)], f["samples/token_position"][: len(latents)]
            masks = dict(zip(f["samples/index"][:].tolist(), f["samples/attention_mask"][:], strict=True))
        for feature in (0, 3):
            items[feature].click()
            rows = browser.execute_script(
                "return Array.from(document.querySelectorAll('#section-latents .latent-detail .example')).map(e => "
                "[parseFloat(e.dataset.value), parseInt(e.dataset.sample), Array.from(e.querySelectorAll('.tok')).map(t => t.textContent), "
                "Array.from(e.querySelectorAll('.tok')).map(t => t.dataset.act === undefined ? null : parseFloat(t.dataset.act))])")
            expected = r.top_examples(module, feature)
            assert len(rows) == len(expected)
            for (value, sample, tokens, acts), e in zip(rows, expected, strict=True):
                assert value == pytest.approx(e["value"], rel=1e-6) and sample == e["sample"]
                assert tokens == list(e["context"])
                for i, act in enumerate(acts):  # each context token shows its own activation, read here with h5py
                    position = int(masks[sample][: e["position"]].sum()) - e["at"] + i  # padded row -> token_position
                    row = np.flatnonzero((token_sample == sample) & (token_position == position))
                    assert (act is None) == (len(row) == 0)
                    if len(row):
                        assert act == pytest.approx(float(latents[row[0], feature]), rel=1e-3, abs=1e-6), (i, act)
                assert acts[e["at"]] == pytest.approx(e["value"], rel=1e-3)
        from safetensors.numpy import load_file

        norms = np.linalg.norm(load_file(str(sae_dir / "sae_weights.safetensors"))["W_dec"].astype(np.float64), axis=1)
        caption = browser.execute_script("return document.querySelector('#section-latents .latent-detail .caption').textContent")
        assert caption.startswith("decoder norm") and float(caption.split()[-1]) == pytest.approx(norms[3], rel=1e-3)
        items[3].click()
        browser.execute_script("document.getElementById('section-latents').scrollIntoView()")
        browser.save_screenshot(str(tmp_path / "report.png"))


def test_token_examples_without_stored_input_ids_name_their_sample_and_position(browser, tmp_path):
    """top_examples on token rows of a run that kept no input_ids: no context to show, so each example
    names its sample and position (read here with h5py), never "(image sample #N)"."""
    data = {"dataset": {"_target_": "hookrun.data.text", "files": "pydoc_topics", "max_length": 16, "limit": 4},
            "batch_size": 4, "store": []}
    path = hookrun.run({"model": {"_target_": "hookrun.models.tiny_lm"}, "data": data, "device": "cpu", "progress": False,
                        "hooks": {"t": {"at": "transformer.h.1.mlp.act", "type": "forward",
                                        "actions": [{"name": "top_examples", "k": 3}]}},
                        "output": {"path": str(tmp_path / "noids.h5")}}).path
    open_page(browser, report(path))
    with h5py.File(path) as f:
        samples = f["captures/t/transformer.h.1.mlp.act/top.samples"][0]
        positions = f["captures/t/transformer.h.1.mlp.act/top.positions"][0]
        assert "input_ids" not in f["samples"]
    browser.find_elements("css selector", "#section-latents .latent-list li")[0].click()
    shown = browser.execute_script("return Array.from(document.querySelectorAll('#section-latents .latent-detail .example "
                                   ".tok.at')).map(t => t.textContent)")
    assert shown == [f"(sample #{s}, position {p}; no input_ids stored)" for s, p in zip(samples, positions, strict=True)]


def test_sweep_report_charts_each_metric_against_the_swept_parameter(browser, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli("-m", "experiment=ablation_sweep", "params.factor=0,1", "data.dataset.limit=16",
                   f"hydra.sweep.dir={sweep}", *FAST)
    assert proc.returncode == 0, proc.stderr
    page = report(sweep)
    assert page == sweep / "report.html"
    open_page(browser, page)
    assert sections(browser) == ["section-sweep"]
    titles = browser.execute_script("return Array.from(document.querySelectorAll('#section-sweep .plot')).map(p => p._fullLayout.title.text)")
    assert "ce_intervened against params.factor" in titles and "kl_div_score against params.factor" in titles
    plot = browser.find_elements("css selector", "#section-sweep .plot")[titles.index("ce_intervened against params.factor")]
    ys = browser.execute_script("return arguments[0].data[0].y", plot)
    for job, y in zip(("0", "1"), ys, strict=True):  # factor 0 then 1: each job's own file
        with h5py.File(sweep / job / "captures.h5") as f:
            assert y == pytest.approx(float(f["evaluation/model"].attrs["ce_intervened"]), rel=1e-6)


def test_a_swept_value_that_looks_like_a_plotly_template_is_shown_as_written(browser, tmp_path):
    """plotly fills `%{y}` in a hover template and a legend's `<extra>` with the point's value: a job's label
    (`params.tag=%{y}`) and a heatmap's axis label from the file are drawn as written, in Chromium."""
    from hookrun.analysis.report import Report
    from hookrun.analysis.report.figure_specs import Heatmap, Lines
    from hookrun.analysis.report.run_sections import figure, section

    job, axis = "params.tag=%{y} <b>%{x}</b>", "at (%{z})"
    lines = Lines(x=["block1", "block2"], series={job: [0.25, 0.5]}, xlabel="hook point", ylabel="test score",
                  title="t", in_order=True)
    heat = Heatmap(z=np.array([[0.125]]), title="h", x=["a"], y=["b"], xlabel=axis, ylabel=axis, label="linear CKA")
    page = tmp_path / "report.html"
    Report({"title": "t", "source": str(tmp_path), "sections": [section("s", "s", [figure(lines), figure(heat)])]}).save(page)
    open_page(browser, page)
    plots = browser.find_elements("css selector", ".plot")
    browser.execute_script("Plotly.Fx.hover(arguments[0], [{curveNumber: 0, pointNumber: 0}])", plots[0])
    for _ in range(30):
        text = browser.execute_script("return Array.from(arguments[0].querySelectorAll('.hoverlayer text'))"
                                      ".map(t => t.textContent).join(' | ')", plots[0])
        if text:
            break
        time.sleep(0.1)
    texts = [text, hover(browser, plots[1], 0, 0)]
    assert job in texts[0] and "0.25" in texts[0], texts[0]  # the job's label as written, then the point's value
    assert f"{axis} · {axis}: b · a" in texts[1] and "0.125" in texts[1], texts[1]
