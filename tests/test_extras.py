"""The install extras (issue 34 item 17): users' S3 client without a server, the server in its own
extra, `dev` a superset of what the S3 tests import, and the README's CPU-only route for PyTorch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


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
