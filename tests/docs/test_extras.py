"""The install extras (issue 34 item 17): users' S3 client without a server, the server in its own
extra, `dev` a superset of what the S3 tests import, and the README's CPU-only route for PyTorch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\s]", r, maxsplit=1)[0].lower() for r in reqs}


def test_s3_client_extra_has_no_server_and_the_server_has_its_own():
    extras = _extras()
    assert {"s3fs", "boto3"} <= _names(extras["s3"])
    assert not any(n.startswith("moto") for n in _names(extras["s3"])), extras["s3"]
    assert "moto[server]" in _names(extras["s3-server"])
    # the S3 tests run moto's server in a thread: dev keeps everything both extras hold
    assert _names(extras["s3"]) | _names(extras["s3-server"]) <= _names(extras["dev"])


def test_readme_install_section_gives_the_cpu_only_pytorch_route():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup
    assert ".[s3-server]" in readme


def _named_combinations() -> set[tuple[str, ...]]:
    """Every combination of extras the README and docs tell users to install (`.[a,b]`,
    `hookrun[a]`), the issue's `dev,bench`, and all of them at once."""
    extras = _extras()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {tuple(sorted(m.split(","))) for page in pages
             for m in re.findall(r"(?:\.|hookrun)\[([a-z0-9,-]+)\]", page.read_text())}
    assert found and all(set(c) <= set(extras) for c in found), found  # each names extras that exist
    return found | {("bench", "dev"), tuple(sorted(extras))}


def _satisfiable(specifiers) -> bool:
    """Whether one version satisfies all `specifiers` (the candidates: every version they name, and
    a little above each, which catches `>=4.3` against `<4`)."""
    from packaging.version import Version

    versions = {Version("0"), Version("99999")}
    for spec in specifiers:
        for s in spec:
            if "*" not in s.version:
                v = Version(s.version)
                versions |= {v, Version(f"{v.base_version}.0.1"), Version(f"{v.base_version}.1")}
    return any(all(v in spec for spec in specifiers) for v in versions)


def test_every_named_combination_of_extras_can_be_installed_together():
    """Issue 41 item 15: `pip install -e ".[dev,bench]"` was impossible (bench asked
    transformer-lens>=4.3, dev <4): no package may be asked for in versions that exclude each other,
    in any combination the README or docs name. (A check of the bounds in pyproject.toml;
    `pip install --dry-run` of each combination against PyPI is its slow, networked twin.)"""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    extras = _extras()
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for combo in sorted(_named_combinations()):
        wanted: dict[str, list] = {}
        for line in [*core, *(r for e in combo for r in extras[e])]:
            req = Requirement(line)
            wanted.setdefault(canonicalize_name(req.name), []).append(req.specifier)
        clashes = {name: [str(s) for s in specs] for name, specs in wanted.items() if not _satisfiable(specs)}
        assert not clashes, f".[{','.join(combo)}] asks for versions that exclude each other: {clashes}"


def test_readme_set_up_is_the_main_job_then_the_tests_with_cpu_torch_first():
    """Issue 41 item 16: two commands, the core install and the main job, then what the tests need
    and the tests (with how long they take); the CPU-only PyTorch route comes before either."""
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    block = setup.split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln.split("#", 1)[0].strip() for ln in block.strip().splitlines()]
    assert lines == ["pip install -e . && python -m hookrun experiment=resnet_layer1",
                     'pip install -e ".[dev]" && python -m pytest -n auto'], lines
    assert re.search(r"about \d+ min", block)  # how long the tests take here, said where the command is
    assert setup.index("download.pytorch.org/whl/cpu") < setup.index("```bash")
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]"' in ci and "download.pytorch.org/whl/cpu" in ci  # CI installs as the README says
    assert ci.rstrip().splitlines()[-1] == "python3 -m pytest -n auto"  # and runs the README's test command


def test_a_command_the_docs_run_after_pip_install_comes_with_the_extras_they_name():
    """docs/caches.md ran `python -m moto.server` after `pip install -e ".[s3]"`, which holds no moto
    (it is in `s3-server`): a reader got `No module named moto`. Every line that runs `python -m PKG`
    and names extras in a comment must name one that lists PKG."""
    extras = _extras()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    checked = 0
    for page in pages:
        for line in page.read_text().splitlines():
            run = re.match(r"\s*python -m ([a-z_]+)", line)
            named = re.search(r"#.*pip install -e \"\.\[([a-z0-9,-]+)\]\"", line)
            if not (run and named) or run.group(1) == "hookrun":
                continue
            held = {n.split("[")[0].replace("-", "_") for e in named.group(1).split(",") for n in _names(extras[e])}
            assert run.group(1) in held, f"{page.name}: {line.strip()!r}: .[{named.group(1)}] does not hold {run.group(1)}"
            checked += 1
    assert checked >= 1
