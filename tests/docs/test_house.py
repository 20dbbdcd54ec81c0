"""What docs/architecture.md promises of every module of the package: it opens with a docstring that
says what it holds (the folder map points there instead of listing files), and none is over 300
lines (issue 46: one concept per module)."""

from __future__ import annotations

import ast

from conftest import ROOT

MODULES = sorted((ROOT / "hookrun").rglob("*.py"))


def test_every_module_says_what_it_holds() -> None:
    assert len(MODULES) > 150
    missing = [str(p.relative_to(ROOT)) for p in MODULES if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_no_module_is_over_300_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in MODULES if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}
