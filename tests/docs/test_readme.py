"""The README's code runs as written (issue 23, friction): every Python block and every shell
command, in the order a reader meets them, in one fresh folder, so the front door cannot drift from
the code. A block is skipped only where the line before it says so, with the reason:

    <!-- no-run: why -->

(for the set-up itself, files shown rather than run, and commands that need a GPU or a cluster).
The runner, shared with the docs pages' test (tests/docs/test_docs.py), is tests/helpers/doc_blocks.py."""

from __future__ import annotations

import pytest
from doc_blocks import ROOT, blocks, commands, env, parse, run_page


def test_the_block_parser_finds_commands_output_and_skips():
    text = "<!-- readme-test: skip (x) -->\n```bash\npip install x\n```\n```bash\n$ a b\nout\n$ c \\\n```\n```python\nprint(1)\n```"
    found = blocks(text)
    assert [(lang, skip) for lang, _, skip in found] == [("bash", True), ("bash", False), ("python", False)]
    assert commands(found[1][1]) == ["a b", "c \\"]
    assert commands("x \\\n  --y 1  # note\nz") == ["x    --y 1  # note", "z"]


def test_a_no_run_mark_gives_its_reason():
    assert [reason for _, _, reason in parse("<!-- no-run: needs S3 -->\n```python\nx\n```")] == ["needs S3"]
    with pytest.raises(ValueError, match="needs its reason"):
        parse("<!-- no-run: -->\n```python\nx\n```")


@pytest.mark.slow
def test_every_readme_command_and_python_block_runs(tmp_path):
    ran, marked = run_page(ROOT / "README.md", tmp_path, env())
    assert ran >= 13 and marked <= 2  # the README's blocks and commands (13: the notebook block runs in docs/notebook.md), the set-up and an excerpt marked
    print(f"README: {ran} blocks and commands run, {marked} marked no-run")
