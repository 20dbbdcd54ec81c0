"""What plot's pictures say: a colour bar's label whole inside the figure however many lines the
sample titles take, the 'not drawn' line of a sweep's True/False column, and a token model's
attribution picture in the words of tokens."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from hookrun.analysis.report.figure_specs import MapRow  # noqa: E402
from hookrun.cli import figures  # noqa: E402
from hookrun.cli.sample_figures import render  # noqa: E402


@pytest.mark.parametrize("n", [2, 4])
def test_the_colour_bar_label_lies_inside_the_figure_when_titles_take_three_lines(tmp_path, n):
    caps = [f"#{i} · pred a_very_long_class_name_number_{i} · target another_quite_long_class_name_{i}" for i in range(n)]
    label = "Grad-CAM (scaled to 0-1 per sample)"
    spec = MapRow(np.random.default_rng(0).random((n, 7, 7)), caps, "run · Grad-CAM at layer1.0 (hooks a, b/grad)", label,
                  np.arange(n), None, no_pictures="\n(no input images: record the model's input, or pass --data)")
    fig = render(spec)
    path = figures.save(fig, tmp_path / "g.png")
    fig.canvas.draw()  # (as written: save drew it at the same dpi)
    assert max(t.get_text().count("\n") for t in fig.axes[0].texts + [fig.axes[0].title]) >= 2  # titles of 3+ lines
    bar = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"][0]
    ext, box = bar.yaxis.label.get_window_extent(), fig.bbox
    assert bar.yaxis.label.get_text() == label
    assert box.y0 <= ext.y0 and ext.y1 <= box.y1 and box.x0 <= ext.x0 and ext.x1 <= box.x1, (ext, box)
    from PIL import Image

    with Image.open(path) as im:  # the file is the figure measured
        assert abs(im.size[0] - box.width) < 1 and abs(im.size[1] - box.height) < 1


class _Sweep:  # what plot_sweep reads of a sweep: its table, swept keys, folder and jobs (none: no kind's pictures)
    def __init__(self, folder, rows):
        from hookrun.analysis.kind_readers import Table

        self.folder, self.swept, self.jobs = folder, ["probe.l2"], []
        self._table = Table(["job", "probe.l2", "status", "probe converged", "probe test", "probe nan"], rows)

    def table(self, stats=("mean",)):
        return self._table


def test_a_sweeps_true_false_column_is_not_drawn_and_the_line_says_why(tmp_path, capsys):
    from hookrun.cli.plot_command import plot_sweep

    rows = [{"job": k, "probe.l2": c, "status": "complete", "probe converged": np.bool_(k != 1), "probe test": 0.5 + k / 10,
             "probe nan": float("nan") if k else 1.0} for k, c in enumerate((0.1, 1.0, 10.0))]
    written = plot_sweep(_Sweep(tmp_path, rows), tmp_path / "figs")
    out = capsys.readouterr().out.splitlines()
    assert [p.name for p in written] == ["sweep_probe_test_vs_probe.l2.png"]  # the one column with numbers
    assert "not drawn: probe converged against probe.l2 (True/False in each job: a yes/no column is not drawn as a number " \
           "(the sweep's table shows it))" in out
    assert "not drawn: probe nan against probe.l2 (fewer than two jobs wrote a number to it)" in out  # 1 finite of 3


@pytest.mark.parametrize("byte_text", [True, False])
def test_a_token_models_attribution_picture_speaks_of_tokens(tmp_path, byte_text):
    pytest.importorskip("transformers")
    import torch

    import hookrun
    from hookrun.data.text import ByteTokenizer
    from hookrun.runner.kinds.attribution.pictures import figures as attribution_figures

    block = {"method": "integrated_gradients", "at": "transformer.wte", "target": "predicted", "steps": 2}
    cfg = {"data": {"batch_size": 2, "target": None}, "device": "cpu", "progress": False,
           "output": {"path": str(tmp_path / "t.h5")}, "attribution": block}
    if byte_text:  # data=text's byte tokens: the run's config says how to read them
        cfg["model"] = {"_target_": "hookrun.models.tiny_lm"}
        cfg["data"]["dataset"] = {"_target_": "hookrun.data.text", "files": "pydoc_topics", "max_length": 10, "limit": 2}
        hookrun.run(cfg)
    else:  # token ids of a user's model: no tokenizer known
        from toy_lm import tiny_gpt2

        ids = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(0))
        hookrun.run(cfg, model=tiny_gpt2(0, vocab_size=50), dataset=[{"input_ids": ids[i]} for i in range(2)])
    with hookrun.open_run(tmp_path / "t.h5") as run:
        target = run.file["captures/attribution/transformer.wte/target"][:2]
        (stem, spec), *_ = attribution_figures(run, 2)
        fig = render(spec)
    tok = ByteTokenizer()
    said = [f"'{tok.decode([int(t)])}'" if byte_text else f"token {int(t)}" for t in target]  # ids read back, decoded here
    assert [ax.get_title() for ax in fig.axes[:2]] == [f"#{k} · target {said[k]} · p {float(p):.2f}"
                                                       for k, p in enumerate(run_probs(tmp_path / "t.h5"))]
    title = fig._suptitle.get_text()
    assert "summed over transformer.wte's features at each token position" in title
    assert "channels" not in title and "input images" not in title
    width = spec.maps.shape[-1]
    for ax in fig.axes[:2]:
        assert ax.get_xlabel() == "token position"
        ticks = [t for t in ax.get_xticks() if -0.5 <= t <= width - 0.5]
        assert ticks and all(float(t).is_integer() for t in ticks)


def run_probs(path):
    import h5py

    with h5py.File(path) as f:
        return f["captures/attribution/transformer.wte/prob"][:2]


TEXTS = ["US\\$ 5", "cost $5-$10", "$\\frac{a}{b}$", "C:\\new\\$x", "$\\mathdefault{x}$"]  # a data set's text, as written


@pytest.mark.parametrize("spec_kind", ["heatmap", "map_row", "lines"])
def test_a_data_sets_text_is_drawn_as_written_backslashes_and_dollars_included(tmp_path, spec_kind):
    """Class names, sample captions and token text reach titles, cells and tick labels: '\\$' was
    drawn '$' (matplotlib reads '\\$' as an escaped dollar outside maths), and a text holding
    '\\mathdefault' was left to maths (taken for a formatter's number). Every text is read back as matplotlib draws it
    (Text._preprocess_math: the string shown and whether it is maths), after save (which runs
    literal_text) and a second literal_text (upright_if_crowded runs it too)."""
    import re

    from matplotlib.text import Text

    from hookrun.analysis.report.figure_specs import Heatmap, Lines
    from hookrun.cli.figure_ticks import upright_if_crowded

    n = len(TEXTS)
    if spec_kind == "heatmap":
        spec = Heatmap(np.arange(n * n, dtype=float).reshape(n, n), f"probe · {TEXTS[0]}", x=TEXTS, y=TEXTS,
                       xlabel=TEXTS[1], ylabel=TEXTS[2], label=TEXTS[3], cells=[TEXTS] * n)
    elif spec_kind == "map_row":
        spec = MapRow(np.random.default_rng(0).random((n, 4, 4)), TEXTS, f"Grad-CAM · {TEXTS[0]}", TEXTS[4], np.arange(n))
    else:  # (categories in order: tick labels of a FuncFormatter; numbers on y)
        spec = Lines(TEXTS, {TEXTS[0]: list(range(n))}, TEXTS[1], TEXTS[2], TEXTS[3], in_order=True)
    fig = render(spec)
    upright_if_crowded(fig, fig.axes[0])
    figures.save(fig, tmp_path / "t.png")
    fig.canvas.draw()
    numbers = [t for t in fig.findobj(Text) if re.fullmatch(r"\$\\mathdefault\{[^a-z]*\}\$", t.get_text())]
    shown = {t._preprocess_math(t.get_text()) for t in fig.findobj(Text) if t.get_text() and t not in numbers}
    for text in TEXTS:  # each where the spec put it, as written, never maths
        assert any(text in s and maths is False for s, maths in shown), (text, shown)
    assert not any(maths for s, maths in shown if any(text in s for text in TEXTS))
    assert all(t._preprocess_math(t.get_text())[1] for t in numbers)  # (the formatters' numbers: still maths)
    assert numbers or spec_kind == "map_row"


CONTROL = ["car\rret · target 3", "\x1b[31mRED\x1b[0m", "tab\there"]  # class names, tokens: control characters


@pytest.mark.parametrize("spec_kind", ["heatmap", "map_row", "lines"])
def test_a_data_sets_control_characters_are_drawn_as_escapes_never_acted_on(tmp_path, spec_kind):
    """matplotlib stops drawing a text at a carriage return: a class name 'car\\rret' in a Grad-CAM
    caption hid the rest of the caption (the target class). Every text and tick label is drawn with
    each character that does not print as its escape (\\x0d, \\x1b), the rest of the text kept."""
    from matplotlib.text import Text

    from hookrun.analysis.report.figure_specs import Heatmap, Lines

    n = len(CONTROL)
    if spec_kind == "heatmap":
        spec = Heatmap(np.arange(n * n, dtype=float).reshape(n, n), f"probe · {CONTROL[0]}", x=CONTROL, y=CONTROL,
                       xlabel=CONTROL[1], ylabel=CONTROL[2], label=CONTROL[0], cells=[CONTROL] * n)
    elif spec_kind == "map_row":
        spec = MapRow(np.random.default_rng(0).random((n, 4, 4)), CONTROL, f"Grad-CAM · {CONTROL[1]}", CONTROL[0], np.arange(n))
    else:
        spec = Lines(CONTROL, {CONTROL[0]: list(range(n))}, CONTROL[1], CONTROL[2], CONTROL[0], in_order=True)
    fig = render(spec)
    figures.save(fig, tmp_path / "t.png")
    fig.canvas.draw()
    shown = " | ".join(t._preprocess_math(t.get_text())[0] for t in fig.findobj(Text) if t.get_text())
    escape = lambda s: "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s)  # noqa: E731
    assert not any(c in shown for c in "\r\x1b\t"), repr(shown)
    for text in CONTROL:
        assert escape(text) in shown.replace("\n", " "), (escape(text), shown)
