"""`python -m hookrun.circuits export|score ...`: the entry point; the code is in hookrun.cli.circuits_command."""

from hookrun.cli.circuits_command import main
from hookrun.cli.command import exit_process

if __name__ == "__main__":
    exit_process(main)
