"""`python -m hookrun.report PATH [--out FILE]`: the entry point; the code is in hookrun.cli.report_command."""

from hookrun.cli import exit_process
from hookrun.cli.report_command import main

if __name__ == "__main__":
    exit_process(main)
