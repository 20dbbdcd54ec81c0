"""The code blocks of a Markdown page, run as a reader would run them: the one runner of the README's
test (tests/docs/test_readme.py) and the docs pages' (tests/docs/test_docs.py).

    ran, marked = run_page(ROOT / "docs/caches.md", folder, env())

Every ```python block runs in one namespace per page (the blocks share names, as a reader's session
does) with the folder as the working directory; every ```bash block's commands run in a subprocess
there. A block is left out only where one of the two lines before it says why:

    <!-- no-run: needs an S3 server -->

(`<!-- readme-test: skip (why) -->` is the README's older spelling of the same mark). A mark
without a reason is an error. Shell blocks: lines starting with `$ ` are commands and the other
lines their output; a block without `$ ` is all commands (a trailing backslash continues a line).
A `python -m MODULE` command runs in a child of a process that has imported torch already
(tests/helpers/warm_python.py), which saves its start-up's torch import; MODULE imports fresh.

A page's full-size command may run at test size: `sizes` maps the command (its words, comments
left out) to overrides the page documents, appended to it (each one must be met on the page):

    run_page(page, folder, env(), sizes={"python -m hookrun experiment=sae_cache": ("data.dataset.limit=128",)})
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import warm_python

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"<!--\s*(?:no-run\s*:|readme-test:\s*skip\b)(.*?)-->")


def parse(text: str) -> list[tuple[str, str, str | None]]:
    """(language, code, the reason it is not run or None) of every fenced block, in order.

    Raises:
        ValueError: a no-run mark that gives no reason.
    """
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        reason = None
        for j in range(max(0, i - 2), i):
            mark = MARK.search(lines[j])
            if mark:
                reason = mark.group(1).strip().strip("()").strip()
                if not reason:
                    raise ValueError(f"line {j + 1}: a no-run mark needs its reason: <!-- no-run: why -->")
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        out.append((m.group(1), "\n".join(lines[i + 1 : j]), reason))
        i = j + 1
    return out


def blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, code, skipped) of every fenced block, in order."""
    return [(lang, code, reason is not None) for lang, code, reason in parse(text)]


def commands(code: str) -> list[str]:
    """The shell commands of a block: its `$ ` lines, or every line (backslashes joined)."""
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


def env() -> dict[str, str]:
    """The environment of the shell commands: this checkout first on the path, nothing downloaded."""
    out = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    out.pop("HYDRA_FULL_ERROR", None)
    return out


def run_page(page: Path, folder: Path, environ: dict[str, str], namespace: dict | None = None,
             sizes: dict[str, tuple[str, ...]] | None = None) -> tuple[int, int]:
    """Run every python and bash block of `page` in `folder`; (blocks and commands run, blocks marked).
    A command that `sizes` names gets its overrides appended (the test's size of a full-size run).

    Raises:
        AssertionError: a command that exits non-zero (its stderr's tail in the message), or a
            command of `sizes` the page does not have; a Python block's own exception propagates
            with the page and block in its traceback.
    """
    namespace = {} if namespace is None else namespace
    unmet = dict(sizes or {})
    ran = marked = 0
    if not (folder / "examples").exists():  # a reader runs the pages from the clone's root
        (folder / "examples").symlink_to(ROOT / "examples")
    for n, (lang, code, reason) in enumerate(parse(page.read_text())):
        if lang not in ("bash", "python"):
            continue
        if reason is not None:
            marked += 1
            continue
        if lang == "python":
            script = folder / f"{page.stem}-block{n}.py"  # the traceback names the page and block
            script.write_text(code)
            cwd = os.getcwd()
            os.chdir(folder)
            try:
                exec(compile(code, str(script), "exec"), namespace)
            finally:
                os.chdir(cwd)
            ran += 1
            continue
        for cmd in commands(code):
            argv = shlex.split(cmd, comments=True)
            argv += unmet.pop(" ".join(argv), ())
            if argv[:2] == ["python", "-m"]:  # its start-up's torch import shared (hookrun imported fresh)
                proc = warm_python.run_module(argv[2], argv[3:], cwd=folder, env=environ, timeout=900)
            else:
                argv = [sys.executable if a == "python" else a for a in argv]
                proc = subprocess.run(argv, cwd=folder, env=environ, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"{page.name}: command failed: {cmd}\n{proc.stderr[-3000:]}"
            ran += 1
    assert not unmet, f"{page.name}: no such command to run at test size: {list(unmet)}"
    return ran, marked
