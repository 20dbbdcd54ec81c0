"""How every `python -m hookrun.X` command ends: its exit code, or one line on stderr.

    def main(argv=None) -> int:
        a = parser.parse_args(argv)
        return run_command(lambda: body(a), needs="pip install 'hookrun[plot]'")

A HookrunError is printed as `PROG: error: MESSAGE` and exits 2, with no traceback; so is an
ImportError where the command names the extra that provides it (`needs`); anything else is a bug
and keeps its traceback. The body returns its exit code (None: 0).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from hookrun.errors import HookrunError


def run_command(body: Callable[[], int | None], prog: str = "hookrun", needs: str | None = None) -> int:
    try:
        code = body()
    except HookrunError as exc:
        return fail(str(exc), prog)
    except ImportError as exc:
        if needs is None:
            raise
        return fail(f"{exc}; {needs}", prog)
    return 0 if code is None else code


def fail(message: str, prog: str = "hookrun") -> int:
    """Print one error line and give the exit code of a refused command (2)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
