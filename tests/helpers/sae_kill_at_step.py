"""An `sae:` run SIGKILLed right after training step N, for the resume tests (run as a script).

    python tests/helpers/sae_kill_at_step.py 13 config '{"model": ..., "sae": ...}'   # hookrun.run(config)
    python tests/helpers/sae_kill_at_step.py 9 compose '["experiment=sae_train", ...]'  # hookrun.compose(*overrides)

The trainer's step is wrapped so that once the step count reaches N the process kills itself (-9):
whatever the writer thread flushed and the checkpoints saved before it are what a resume finds.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def main() -> None:
    kill_at, mode, spec = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    from hookrun.runner.kinds.sae import engine

    step = engine.LoggingTrainer.step

    def killing(self, batch):  # noqa: ANN001, ANN202
        out = step(self, batch)
        if self.n_training_steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    engine.LoggingTrainer.step = killing
    import hookrun

    hookrun.run(hookrun.compose(*spec) if mode == "compose" else spec)


if __name__ == "__main__":
    main()
