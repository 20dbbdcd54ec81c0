"""`python -m hookrun.inspect PATH`: the entry point; the code is in hookrun.cli.inspect_command."""

from hookrun.cli import exit_process
from hookrun.cli.inspect_command import main

if __name__ == "__main__":
    exit_process(main)
