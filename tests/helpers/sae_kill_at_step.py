"""An `sae:` run SIGKILLed right after training step N, for the resume tests (run as a script).

    python tests/helpers/sae_kill_at_step.py 13 config '{"model": ..., "sae": ...}'   # hookrun.run(config)
    python tests/helpers/sae_kill_at_step.py 9 compose '["experiment=sae_train", ...]'  # hookrun.compose(*overrides)

The trainer's step is wrapped so that once the step count reaches N the process kills itself (-9):
whatever the writer thread flushed and the checkpoints saved before it are what a resume finds:
`resume_line` is the log line the resume then writes (how many steps the file kept before the kill
depends on the writer thread, so the line is made from what is on disk).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def resume_line(checkpoints: Path, kept: int, batch_rows: int) -> str:
    """The resume's log line for a file that kept `kept` steps: it starts from the last checkpoint at or
    before them (a checkpoint's folder is named by the samples trained when it was saved)."""
    steps = [int(p.name) // batch_rows for p in checkpoints.iterdir()] if checkpoints.is_dir() else []
    done = max((s for s in steps if s <= kept), default=0)
    head = f"from checkpoint step {done}" if done else "no checkpoint: from the start"
    return f"resume: {head}; {kept - done} training step(s) run again to the {kept} the file holds"


def signal_at_step(n: int, signum: int) -> object:
    """The trainer's step, wrapped so that the process sends itself `signum` right after training step n."""
    from hookrun.runner.kinds.sae import engine

    step = engine.LoggingTrainer.step

    def signalling(self, batch):  # noqa: ANN001, ANN202
        out = step(self, batch)
        if self.n_training_steps == n:
            os.kill(os.getpid(), signum)
        return out

    return signalling


def interrupt_at_step(monkeypatch, n: int) -> object:  # noqa: ANN001
    """In this process: Ctrl-C (SIGINT) right after training step n, so hookrun.run raises Interrupted;
    returns the step as it was, to put back with monkeypatch.setattr(engine.LoggingTrainer, "step", it)."""
    from hookrun.runner.kinds.sae import engine

    step = engine.LoggingTrainer.step
    monkeypatch.setattr(engine.LoggingTrainer, "step", signal_at_step(n, signal.SIGINT))
    return step


def main() -> None:
    kill_at, mode, spec = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    from hookrun.runner.kinds.sae import engine

    engine.LoggingTrainer.step = signal_at_step(kill_at, signal.SIGKILL)
    import hookrun

    hookrun.run(hookrun.compose(*spec) if mode == "compose" else spec)


if __name__ == "__main__":
    main()
