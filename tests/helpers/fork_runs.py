"""Many `python -m hookrun` runs without paying Python's and torch's start-up for each (tests only).

    echo '{"args": [...], "runs": [{"dir": "ref"}, {"dir": "k1", "kill_after": 0.4}]}' | python tests/helpers/fork_runs.py

This process imports hookrun's CLI once, then forks one child per run; the child runs the CLI's
main() with the given arguments, exactly what `python -m hookrun ARGS` runs after its imports.
A run with `kill_after` gets SIGKILL that many seconds after it started; `kill_after_share` at that
share of the first run's file's life (from the moment its file appeared to the run's end). Prints one JSON line: each run's exit status
(or "killed") and wall time. With `"side_by_side": N` in the plan (runs without a kill only: their
timing does not matter), N runs at a time are children at once; the results keep the runs' order.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from hookrun.cli.app import main


def child(args: list[str]) -> None:
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        sys.argv = ["hookrun", *args]
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os._exit(code)


def start(args: list[str]) -> int:
    pid = os.fork()
    if pid == 0:
        child(args)
    return pid


def side_by_side(plan: dict, n: int) -> list[dict]:
    """Every run of the plan to its end, `n` children at a time (no kills: wall time is not recorded)."""
    results: list[dict] = [{} for _ in plan["runs"]]
    waiting = list(enumerate(plan["runs"]))
    running: dict[int, int] = {}  # pid -> the run's place
    while waiting or running:
        while waiting and len(running) < n:
            i, run = waiting.pop(0)
            assert run.get("kill_after") is None and run.get("kill_after_share") is None, run
            running[start([*plan["args"], f"hydra.run.dir={run['dir']}", *run.get("extra", [])])] = i
        pid, status = os.wait()
        i = running.pop(pid)
        results[i] = {"dir": plan["runs"][i]["dir"], "code": os.waitstatus_to_exitcode(status)}
    return results


def go(plan: dict) -> list[dict]:
    if plan.get("side_by_side"):
        return side_by_side(plan, plan["side_by_side"])
    results: list[dict] = []
    first_seconds = file_at = None
    for run in plan["runs"]:
        args = [*plan["args"], f"hydra.run.dir={run['dir']}", *run.get("extra", [])]
        kill_after = run.get("kill_after")
        if kill_after is None and run.get("kill_after_share") is not None:  # of the first run's file's life
            kill_after = file_at + run["kill_after_share"] * (first_seconds - file_at)
        started = time.monotonic()
        pid = start(args)
        appeared = None
        if kill_after is not None:
            time.sleep(max(0.0, started + kill_after - time.monotonic()))
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        else:  # note when the output file appears
            output = os.path.join(run["dir"], "captures.h5")
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
                if appeared is None and os.path.exists(output):
                    appeared = time.monotonic() - started
                time.sleep(0.005)
            status = done[1]
        seconds = time.monotonic() - started
        if first_seconds is None:
            first_seconds, file_at = seconds, appeared or 0.0
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        results.append({"dir": run["dir"], "code": "killed" if killed else os.waitstatus_to_exitcode(status),
                        "seconds": seconds, "kill_after": kill_after, "file_at": appeared})
    return results


if __name__ == "__main__":
    print(json.dumps(go(json.load(sys.stdin))))
