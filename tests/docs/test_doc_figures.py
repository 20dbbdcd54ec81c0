"""Figures the docs quote that their own text lets a reader check (the docs' blocks run in
tests/docs/test_docs.py, but the output and comments they print are read, not run): a folder a block
reads is the one the block's sweep writes, a job's overrides are those Hydra gives that job, a run's
size is the sum of the captures listed under it."""

from __future__ import annotations

import math
import re

from conftest import ROOT
from doc_blocks import commands, parse

ANALYSIS = (ROOT / "docs" / "analysis.md").read_text()


def test_the_full_analysis_reads_the_sweep_folder_its_own_sweep_writes():
    """The sweep of 'A full analysis' wrote to Hydra's default outputs/multirun/DATE/TIME while its
    next steps read outputs/sweep: a reader following it got no such folder (or an older sweep)."""
    part = ANALYSIS.split("### A full analysis", 1)[1].split("\n### ", 1)[0]
    bash = [code for lang, code, _ in parse(part) if lang == "bash"][0]
    cmds = commands(bash)
    sweep = [c for c in cmds if " -m experiment=" in c][0]
    written = re.search(r"hydra\.sweep\.dir=(\S+)", sweep)
    assert written, sweep
    read = [re.search(r"hookrun\.(?:inspect|plot) (\S+)", c).group(1) for c in cmds if re.search(r"hookrun\.(inspect|plot) ", c)]
    read += re.findall(r'open_sweep\("([^"]+)"\)', part)
    assert read and set(read) == {written.group(1)}, (written.group(1), read)


def test_the_job_whose_overrides_the_page_prints_is_the_job_with_that_value():
    """`sweep.jobs[0].overrides  # {'params.factor': 0.5, ...}` on the sweep of params.factor=0,0.5,1:
    Hydra numbers the jobs in the order the values are listed, so job 0 has 0 (measured:
    {'params.factor': 0, ...}) and 0.5 is job 1's."""
    values = re.search(r"experiment=ablate_layer3 params\.factor=([\d.,]+)", ANALYSIS).group(1).split(",")
    job, shown = re.search(r"sweep\.jobs\[(\d+)\]\.overrides\s+# \{'params\.factor': ([\d.]+)", ANALYSIS).groups()
    assert float(values[int(job)]) == float(shown), (values, job, shown)


def test_the_readme_run_line_gives_the_size_of_the_captures_inspect_lists():
    """The README's log line said 103.0 MB for two captures of 49.0 MiB (64 x 64 x 56 x 56 float32 each:
    2 x 51,380,224 bytes = 102.76 MB, and the run prints 102.8 MB)."""
    readme = (ROOT / "README.md").read_text()
    part = readme.split("## A first run", 1)[1].split("\n## ", 1)[0]
    mb = float(re.search(r"complete: .*?, ([\d.]+) MB in", part).group(1))
    shapes = re.findall(r"^\s+\S+/output\s+\(([\d, ]+)\)\s+float32", part, flags=re.M)
    assert len(shapes) == 2, shapes
    total = sum(4 * math.prod(int(n) for n in s.split(",")) for s in shapes) / 1e6
    assert abs(mb - total) < 0.1, (mb, total)
