"""`python -m hookrun.plot PATH [--out DIR]`: pictures of a run or a sweep (PNG, matplotlib), by
default in figures/ beside the run's file (or in the sweep folder).

    python -m hookrun.plot outputs/2026-11-21/10-00-00/captures.h5 --out figures/
    python -m hookrun.plot outputs/multirun/2026-11-21/10-00-00 --out figures/ --stat std

For a run: a feature-map grid for each 4-D capture of maps, a grid of heads for each attention pattern
(a capture whose dims are `sample, head, query, key`: query and key positions labelled with the
tokens' text where the file holds /samples/input_ids of byte tokens, else with their positions,
padding left out), a histogram for each capture whose values make a distribution, and Grad-CAM
overlays where the run holds a layer's output and its gradient (type tensor, or backward's
grad_output) for the same samples, with each sample's predicted class (from a recorded logits
capture) and target. The overlay's input images come from the file itself when the run recorded
them (a 4-D input capture with 1 or 3 channels); otherwise from a dataset the user names with
`--data data=... [key=value ...]` (its labels must be /samples/target; without targets a data
config other than the run's is warned of). A kind's grids and the hook actions' pictures (the logit
view of each layer) are heatmaps with labelled axes, titled and named by method and metric
(`grid_resid_atp_logit_diff_normalised.png`: each kind's reader and each drawing of
analysis/drawings.py names its pictures; an action's per-sample pictures start with the mean over
every sample). Not drawn, each said in one line (`not drawn: ...: why`): histograms of integer
captures (token ids, indices), of curves' points over steps, of the rows a drawing shows itself and of captures
with no finite value, and maps that are one value over space in every channel (a
gradient after global pooling). Reading a file never builds anything the file names. For a sweep: each metric
(the kind's numbers, then each capture's `--stat`) against each swept parameter where two jobs or more
have a number, then the kind's own pictures of the sweep (its reader's `sweep_figures`). What is drawn is decided
once with the HTML report (analysis/report/figure_specs.py); a figure with nothing to draw is not written
(the command says so), and when nothing at all can be drawn the command exits 2. The files
written are listed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from hookrun.analysis.drawings import drawn_pictures
from hookrun.analysis.kind_readers import kind_figures, kind_sweep_figures, unread_kind
from hookrun.analysis.opening import open_run
from hookrun.analysis.report.figure_specs import (
    NotShown,
    constant_over_space,
    no_information,
)
from hookrun.analysis.report.run_sections import LeftOut, is_map
from hookrun.analysis.report.sweep_charts import not_drawn, sweep_charts, sweep_metrics
from hookrun.analysis.report.token_text import byte_label  # noqa: F401 (plot's public name)
from hookrun.analysis.run_notes import run_note, unfinished
from hookrun.analysis.run_reader import Run
from hookrun.analysis.sweep import Sweep, is_sweep, open_sweep
from hookrun.cli import (
    at_least_one,
    description,
    ends_quietly,
    exit_process,
    fail,
    figures,
    run_command,
)
from hookrun.cli.capture_figures import (
    attention_maps,
    feature_maps,
    file_name,
    histogram,
    is_pattern,
    source_of,
)
from hookrun.cli.compose import compose_config
from hookrun.cli.sample_figures import check_covers, check_same_data, render, with_pictures
from hookrun.config import load
from hookrun.config.build import build_dataset
from hookrun.error_words import refused_write
from hookrun.errors import ConfigError, NotFoundError, RunError
from hookrun.store.paths import local_only
from hookrun.store.reading import UrlPath, run_path


def identity(run: Run) -> str:
    """Which run wrote the file (its start stamp and its config's hash): a re-run into the same file
    differs, so its figures tell the replaced run's (remove_replaced)."""
    a = run.file.attrs
    return f"{a.get('created', '?')} {hashlib.blake2b(str(a.get('config', '')).encode(), digest_size=4).hexdigest()}"


def remove_replaced(out: Path, source: str, run: str) -> int:
    """Remove the PNGs in `out` that figures.save wrote of the file `source` when another run had written
    it (their "Run" is not `run`); any other PNG (a user's, another file's, one without hookrun's
    metadata) stays. Returns how many went."""
    old = [p for p in sorted(out.glob("*.png")) if (m := figures.metadata(p)).get("Source") == source and m.get("Run") not in (None, run)]
    for path in old:
        path.unlink(missing_ok=True)
    return len(old)


def plot_run(run: Run, out: Path, samples: int | None = None, channels: int = 16, dataset: object | None = None) -> list[Path]:
    """Every picture of a run that carries information; what is left out is said in one line a
    reason ("not drawn: ... (why)")."""
    # the drawings' and the kind's figures are read first: a damaged attribute stops plot before any PNG is written
    drawn = [*drawn_pictures(run, samples, first=True), *kind_figures(run, samples), *drawn_pictures(run, samples, first=False)]
    out.mkdir(parents=True, exist_ok=True)
    figures.RUN_OF[source_of(run)] = identity(run)  # (each PNG names the run that wrote its file)
    written, left, taken = [], LeftOut(), set()
    shown = samples or 2  # (the maps' and patterns' grids; a drawing's or kind's picture has its own default)
    for info in run.captures:
        if not info.shape[0]:  # (a run stopped before its first batch was written: nothing to draw, no error)
            left.add(info.label, "no rows written")
            continue
        if is_pattern(info):
            written.append(attention_maps(run, info, out, shown, channels, taken))
        elif is_map(info):
            rows = np.asarray(run.file[info.path][: min(shown, info.shape[0])], dtype=np.float32)[:, :channels]
            if constant_over_space(rows):
                left.add(f"the maps of {info.label}", "each channel is one value over space (a gradient after global pooling)")
            else:
                written.append(feature_maps(run, info, out, shown, channels, taken))
        written += [p for p in [histogram(run, info, out, left, taken)] if p is not None]
    note = run_note(run)  # a random network's pictures say so in their titles, and a run not complete how far it got
    for stem, spec in drawn:  # the drawings' (analysis/drawings.py), the file's kind's (its reader's), the drawings' after
        if isinstance(spec, NotShown):  # (a picture the kind leaves out, as its report section says it)
            left.add(spec.what, spec.why)
            continue
        if no_information(spec):  # (a grid none of whose cells was computed: a failed run's)
            left.add(f"{file_name(stem)}.png", "no cell has a value (NaN: not computed, or not finite)")
            continue
        spec.title += f" · {note}" if note and note not in spec.title else ""
        written.append(figures.save(render(with_pictures(spec, dataset)), out / f"{file_name(stem)}.png", source=source_of(run),
                                    taken=taken))
    for line in left.lines() + [f"not drawn: the pictures of the kind {note}" for note in [unread_kind(run.file.attrs)] if note]:
        print(line)
    if gone := remove_replaced(out, source_of(run), identity(run)):  # (a replaced run's figures looked current)
        print(f"removed {gone} figure{'' if gone == 1 else 's'} of the replaced run")
    return written


def plot_sweep(sweep: Sweep, out: Path, stat: str = "mean", x: str | None = None) -> list[Path]:
    """Each metric (the kind's numbers, then each capture's `stat`) against each swept parameter (or `x`
    alone), where two jobs or more have a number; then the kind's own pictures of the sweep (its
    reader's `sweep_figures`): one PNG each; NotFoundError where nothing is drawn."""
    table = sweep.table(stats=(stat,))
    swept = [x] if x else sweep.swept
    overrides = table.columns[1:table.columns.index("status")]  # (job, the overrides, status, the numbers)
    if x and x not in overrides:
        raise NotFoundError(f"--x {x}: the sweep has no override {x!r}; it has: {', '.join(overrides) or 'none'}")
    if not swept:
        raise NotFoundError(f"{sweep.folder}: no parameter differs between its {len(sweep.jobs)} jobs; nothing to draw against")
    candidates = [c for c in table.columns[table.columns.index("status") + 1 :] if c != "text"]
    metrics = sweep_metrics(table, swept)
    for column in (c for c in candidates if c not in metrics):
        print(f"not drawn: {column} against {', '.join(swept)} ({not_drawn(table, column)})")
    charts = [(f"sweep_{file_name(c.ylabel)}_vs_{file_name(c.xlabel)}", c) for c in sweep_charts(table, swept, metrics)]
    drawn = [*charts, *kind_sweep_figures(sweep)]
    for left in (spec for _, spec in drawn if isinstance(spec, NotShown)):  # (as the kind's report section says it)
        print(f"not drawn: {left.what} ({left.why})")
    drawn = [(stem, spec) for stem, spec in drawn if not isinstance(spec, NotShown)]
    if not drawn:
        raise NotFoundError(f"{sweep.folder}: no two jobs wrote a number (no kind's metric, no capture); nothing to draw")
    out.mkdir(parents=True, exist_ok=True)
    taken: set[Path] = set()  # (two metrics whose names make one file name: the second is NAME.2.png)
    return [figures.save(render(spec), out / f"{file_name(stem)}.png", source=str(sweep.folder.resolve()), taken=taken)
            for stem, spec in drawn]


@ends_quietly
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.plot", description=description(__doc__))
    p.add_argument("path", type=run_path, help="a capture file, a run folder, a multirun folder, or a cache's URL (s3://...)")
    p.add_argument("--out", default=None,
                   help="folder for the PNGs (default: figures/ beside the run's file, or in the sweep folder); "
                        "a figure of another run there is never replaced")
    p.add_argument("--samples", type=at_least_one, default=None,
                   help="samples per picture (default: 2 in a feature-map or attention grid, 4 in a Grad-CAM row)")
    p.add_argument("--channels", type=at_least_one, default=16,
                   help="channels per sample in a feature-map grid (heads in an attention grid)")
    p.add_argument("--stat", default=None, choices=["mean", "std", "min", "max", "zeros"], help="sweep: the statistic to plot (mean)")
    p.add_argument("--x", help="sweep: the override on the x axis (default: the first swept key)")
    p.add_argument("--data", nargs="+", metavar="OVERRIDE",
                   help="Grad-CAM: the dataset whose images to draw under the maps, as config overrides "
                        "(data=image_folder data.root=PATH); used only when the file holds no input images")
    a = p.parse_args(argv)
    if a.out is None:  # beside what it shows: one run's figures never meet another's
        a.out = (a.path if a.path.is_dir() else Path(".") if isinstance(a.path, UrlPath) else a.path.parent) / "figures"
    return run_command(lambda: _plot(a), needs="install the plot extra: pip install 'hookrun[plot]'")


def _plot(a: argparse.Namespace) -> int:
    a.out = Path(local_only(str(a.out), "--out", "hookrun.plot"))
    made = next((p for p in [*reversed(a.out.absolute().parents), a.out.absolute()] if not p.exists()), None)
    try:  # the folder first: a path it cannot be is one line, not a traceback after the drawing
        a.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out: cannot create the folder {str(a.out)!r} ({exc.strerror}); name a writable one") from None
    try:
        if not os.access(a.out, os.W_OK | os.X_OK):
            raise ConfigError(f"--out: the folder {str(a.out)!r} is not writable; name a writable one")
        why = ""  # (a run not complete: unfinished's note)
        if is_sweep(a.path):
            written = plot_sweep(open_sweep(a.path), a.out, a.stat or "mean", a.x)
        else:
            if a.x is not None or a.stat is not None:
                raise ConfigError(f"{'--x' if a.x is not None else '--stat'} draws a sweep's jobs against each other; "
                                  f"{a.path} is one run (give its sweep folder, or leave the option out)")
            data = load(compose_config(a.data)).data if a.data else None
            dataset = build_dataset(data.dataset) if data is not None else None  # (never one named in the file)
            with open_run(a.path) as run:
                if dataset is not None:
                    check_covers(dataset, run.samples)
                    if warning := check_same_data(dataset, run, {"dataset": data.dataset, "root": data.root}):
                        print(f"hookrun.plot: {warning}", file=sys.stderr)
                written, why = plot_run(run, a.out, a.samples, a.channels, dataset), unfinished(run)
    except OSError as exc:  # (a full disk: the pictures written before it are whole, none cut off under its name)
        if not refused_write(exc):
            raise
        raise RunError(f"--out {a.out}: writing a picture failed ({exc.strerror}); the pictures written before it are whole") from None
    finally:  # (a run that cannot be read, or nothing drawn: the folders this command made go again)
        if made is not None and not any(p.is_file() for p in made.rglob("*")):
            shutil.rmtree(made, ignore_errors=True)
    if not written:
        return fail(f"{a.path}: nothing could be drawn (no capture with rows written, grid or picture of a drawing in it)"
                    + why)  # (a killed run says so)
    print(f"wrote {len(written)} figure(s) to {a.out}:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    exit_process(main)
