"""`python -m hookrun experiment=NAME dry_run=true` for many experiments in one process (tests only):
the CLI's main() run in turn, paying Python's and torch's start-up once.

    python tests/helpers/dry_runs.py ablate_layer3 "patch_layer2 data.dataset.size=2" ...   # NAME [OVERRIDES]

Runs from the current folder. Prints one JSON line: {name: {"code": exit status, "stderr": the run's stderr}}.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from hydra.core.global_hydra import GlobalHydra

from hookrun.cli.app import main


def dry_run(name: str, *overrides: str) -> dict:
    sys.argv = ["hookrun", f"experiment={name}", "dry_run=true", f"hydra.run.dir=dry/{name}", *overrides]
    err = io.StringIO()
    code = 0
    GlobalHydra.instance().clear()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception as exc:  # noqa: BLE001 (a crash: reported, and the next experiment runs)
            code, _ = 1, err.write(f"Traceback (uncaught): {type(exc).__name__}: {exc}")
    return {"code": code, "stderr": err.getvalue()}


if __name__ == "__main__":
    print(json.dumps({arg.split()[0]: dry_run(*arg.split()) for arg in sys.argv[1:]}))
