"""`python -m hookrun.plot PATH --out DIR`: the entry point; the code is in hookrun.cli.plot."""

import sys

from hookrun.cli.plot import main

if __name__ == "__main__":
    sys.exit(main())
