"""`python -m hookrun [overrides]`: the Hydra app of cli/app.py."""

import sys

try:  # Ctrl-C while Python imports the app (a second or two): one line, not an import's traceback
    from hookrun.cli.app import process
except KeyboardInterrupt:
    print("hookrun: interrupted by SIGINT while starting; nothing was written", file=sys.stderr)
    sys.exit(130)

process()
