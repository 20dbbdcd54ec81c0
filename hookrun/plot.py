"""`python -m hookrun.plot PATH --out DIR`: the entry point; the code is in hookrun.cli.plot_command."""

from hookrun.cli import exit_process
from hookrun.cli.plot_command import main

if __name__ == "__main__":
    exit_process(main)
