"""`python -m hookrun.inspect PATH`: the entry point; the code is in hookrun.cli.inspect_command."""

import sys

from hookrun.cli.inspect_command import main

if __name__ == "__main__":
    sys.exit(main())
