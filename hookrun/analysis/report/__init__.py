"""One self-contained HTML page of a run or a sweep: the report `python -m hookrun.report` writes
and `open_run(p).report()` shows in a notebook.

    from hookrun.analysis import open_run
    from hookrun.analysis.report import build_report
    page = build_report(open_run("outputs/first"))      # a Report: .html, .save(path), _repr_html_
    page.save("outputs/first/report.html")

The page is data plus one plotting library: every section is built here as plain data (JSON),
written into the page escaped (analysis/report/page.py), and drawn in the browser by a small
script with plotly.js, both inlined, so the page opens with no network. Only the reader's API is
used (run.captures, run.file, the kinds' readers, the drawings of analysis/drawings.py ...): the
report knows nothing of the runner nor the command line, and names no kind and no action.
"""

from __future__ import annotations

from typing import Any

from hookrun.analysis.drawings import drawn_roles, drawn_sections
from hookrun.analysis.kind_readers import kind_sections, kind_sweep_sections
from hookrun.analysis.report.page import render
from hookrun.analysis.report.run_sections import (
    Budget,
    attention,
    captures,
    figure,
    header,
    section,
    table_item,
)
from hookrun.analysis.report.sweep_charts import sweep_charts, sweep_metrics
from hookrun.analysis.run_notes import run_note, unfinished
from hookrun.errors import NotFoundError
from hookrun.store.paths import scheme_of

__all__ = ["Budget", "Report", "build_report", "run_data", "sweep_data"]


class Report:
    """A built page: `html` (the whole file's text), `save(path)`; shows itself in Jupyter."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.html = render(data)

    @property
    def sections(self) -> list[str]:
        return [s["id"] for s in self.data["sections"]]

    def save(self, path: Any, overwrite: bool = False) -> Any:
        """Write the page to `path` (whole or not at all) and return the path. A file there is replaced
        only where it is this run's report (an older page of it) or `overwrite=True`: another file, or
        a report of another run, is one ConfigError line."""
        from pathlib import Path

        from hookrun.analysis.report.page import source_of
        from hookrun.errors import ConfigError
        from hookrun.store.whole_file import write_whole

        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"Report.save: {str(path)!r} is a folder; name the page's file, e.g. {str(path / 'report.html')!r}")
        if path.exists() and not overwrite and source_of(path) != self.data["source"]:
            held = "a file that is not a hookrun report" if source_of(path) is None else f"the report of {source_of(path)}"
            raise ConfigError(f"Report.save: {str(path)!r} holds {held}; name another path, or save(path, overwrite=True) "
                              f"to replace it")
        return write_whole(path, lambda tmp: tmp.write_text(self.html, encoding="utf-8"))

    def _repr_html_(self) -> str:
        """The page in an iframe (its own document: its script and styles stay out of the notebook's)."""
        import html

        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width:100%;height:800px;border:1px solid #ccc" '
                f'sandbox="allow-scripts"></iframe>')

    def __repr__(self) -> str:
        return f"Report({self.data['title']!r}, sections={self.sections}, {len(self.html) / 1e6:.1f} MB)"


def run_data(run: Any, budget: Budget | None = None) -> dict:
    """The page's data for one run; NotFoundError where the file has nothing to show."""
    budget = budget or Budget()
    kinds = kind_sections(run)  # what the file's kind shows first (its table, its grids)
    early, late = drawn_sections(run, budget)  # the drawings' (analysis/drawings.py): before and after the captures'
    shown = [c for c in run.captures if not c.role.startswith(drawn_roles()) and c.shape[0]]  # (0 rows: nothing to show)
    body = [*kinds, *early, *([captures(run, budget)] if shown else []), *attention(run, budget), *late]
    if not body:
        raise NotFoundError(f"{run.path}: nothing to show (no capture with rows written, kind's rows or top examples in the file)"
                            + unfinished(run))  # (a killed run says so: its results may be what is missing)
    note = run_note(run)  # a random network's page says so in its title, and a run not complete how far it got
    return {"title": f"hookrun report: {run.path}" + (f" ({note})" if note else ""), "source": _source(run.path), "sections": [header(run), *body]}


def sweep_data(sweep: Any) -> dict:
    """The page's data for a sweep: the jobs' table and each metric against each swept parameter."""
    table = sweep.table(stats=("mean",))
    swept = sweep.swept
    items: list[dict] = [table_item(table.columns, table.rows)]
    charts = sweep_charts(table, swept, sweep_metrics(table, swept)) if swept else []
    if charts:
        items.append({"type": "figures", "title": "each metric against each swept parameter", "figures": [figure(c) for c in charts]})
    if not charts and not len(table):
        raise NotFoundError(f"{sweep.folder}: nothing to show")
    note = "" if charts else ("no parameter differs between the jobs" if not swept else "no job wrote a number to chart")
    return {"title": f"hookrun report: sweep {sweep.folder}", "source": _source(sweep.folder),
            "sections": [*kind_sweep_sections(sweep),  # what the jobs' kind compares (its reader's sweep sections)
                         section("sweep", f"Sweep: {len(sweep.jobs)} jobs, swept {', '.join(swept) or 'nothing'}", items, note)]}


def _source(path: Any) -> str:
    """What a page records as the run it shows: a URL as given, a local path made absolute (the
    same run reached from another folder is the same run)."""
    from pathlib import Path

    return str(path) if scheme_of(path).remote else str(Path(path).resolve())


def build_report(source: Any, budget: Budget | None = None) -> Report:
    """The Report of an open run (open_run) or sweep (open_sweep: it has `jobs`; this package
    imports neither class, so the reader can offer `run.report()` without a cycle)."""
    return Report(sweep_data(source) if hasattr(source, "jobs") else run_data(source, budget))
