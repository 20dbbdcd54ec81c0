"""`python -m hookrun.circuits export|score ...`: an edges run's scores to EAP-IG's and MIB's files, and
their circuits scored here. The entry point; the command is the patching kind's
(hookrun/runner/kinds/patching/edges/command.py), ended as every command is (hookrun/cli/__init__.py)."""

from __future__ import annotations

import argparse

from hookrun.cli import description, ends_quietly, exit_process, run_command
from hookrun.runner.kinds.patching.edges import command


@ends_quietly
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hookrun.circuits", description=description(command.__doc__))
    command.add_arguments(p)
    a = p.parse_args(argv)
    return run_command(lambda: command.run(a), prog="hookrun.circuits")


if __name__ == "__main__":
    exit_process(main)
