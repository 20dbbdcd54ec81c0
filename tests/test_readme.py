"""The README's code runs as written (issue 23, friction): every Python block and every shell
command, in the order a reader meets them, in one fresh folder, so the front door cannot drift from
the code. A block is skipped only where the line before it says so, with the reason:

    <!-- readme-test: skip (why) -->

(for the set-up itself, files shown rather than run, and commands that need a GPU or a cluster).
Shell blocks: lines starting with `$ ` are commands and the other lines their output; a block
without `$ ` is all commands (a trailing backslash continues a line)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\b")


def blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, code, skipped) of every fenced block, in order."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        skipped = any(SKIP.search(lines[j]) for j in range(max(0, i - 2), i))
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        out.append((m.group(1), "\n".join(lines[i + 1 : j]), skipped))
        i = j + 1
    return out


def commands(code: str) -> list[str]:
    lines = code.split("\n")
    if any(ln.startswith("$ ") for ln in lines):
        return [ln[2:] for ln in lines if ln.startswith("$ ")]
    joined, cmds = "", []
    for ln in lines:
        if ln.rstrip().endswith("\\"):
            joined += ln.rstrip()[:-1] + " "
            continue
        cmd = (joined + ln).strip()
        joined = ""
        if cmd and not cmd.startswith("#"):
            cmds.append(cmd)
    return cmds


def test_the_block_parser_finds_commands_output_and_skips():
    text = "<!-- readme-test: skip (x) -->\n```bash\npip install x\n```\n```bash\n$ a b\nout\n$ c \\\n```\n```python\nprint(1)\n```"
    found = blocks(text)
    assert [(lang, skip) for lang, _, skip in found] == [("bash", True), ("bash", False), ("python", False)]
    assert commands(found[1][1]) == ["a b", "c \\"]
    assert commands("x \\\n  --y 1  # note\nz") == ["x    --y 1  # note", "z"]


@pytest.mark.slow
def test_every_readme_command_and_python_block_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    env.pop("HYDRA_FULL_ERROR", None)
    namespace: dict = {}
    ran = 0
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # a reader runs the README from the clone's root
    for lang, code, skipped in blocks((ROOT / "README.md").read_text()):
        if skipped or lang not in ("bash", "python"):
            continue
        if lang == "python":
            script = tmp_path / f"block{ran}.py"
            script.write_text(code)
            cwd = os.getcwd()
            os.chdir(tmp_path)
            try:
                exec(compile(code, str(script), "exec"), namespace)  # the blocks share names, as a reader's session does
            finally:
                os.chdir(cwd)
            ran += 1
            continue
        for cmd in commands(code):
            argv = shlex.split(cmd, comments=True)
            argv = [sys.executable if a == "python" else a for a in argv]
            proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"README command failed: {cmd}\n{proc.stderr[-3000:]}"
            ran += 1
    assert ran >= 15
