"""Ranks under Slurm: the tasks of an `srun` step, and what a job sends back to Hydra's submitit launchers.

The srun test starts two processes by hand with the variables an srun step gives each task (as a
real `srun -n2` on one node does; checked with Slurm 22.05), rank 1 seconds after rank 0, and
compares the merged file with the one-process run of the same command (rank_runs.ARGS).
"""

from __future__ import annotations

import pickle
import signal
from pathlib import Path

from hookrun.errors import ConfigError, RunError
from hookrun.output.ranks import every_rank
from hookrun.output.signals import Interrupted, StoreAway


def test_hookrun_errors_come_back_whole_from_a_launchers_worker():
    """submitit pickles the job's exception and Hydra re-raises it in the sweep's process: a SIGTERM'd
    (scancel'd) job came back as `TypeError: Interrupted.__init__() missing 2 required positional
    arguments`, exit 2, instead of the interrupted line and exit 143."""
    sent = [Interrupted(signal.SIGTERM, Path("/run/captures.rank-00000.h5"), 31),
            Interrupted(signal.SIGINT, None, 0, resumed_from=Path("/run/captures.h5")),
            StoreAway("the object store stayed away"), every_rank(ConfigError("data.limit=0: give 1 or more")),
            RunError("a batch failed")]
    for exc in sent:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.args == exc.args
        assert back.exit_code == exc.exit_code and back.__dict__ == exc.__dict__
    assert pickle.loads(pickle.dumps(sent[0])).exit_code == 143 and sent[0].signum == signal.SIGTERM
    assert pickle.loads(pickle.dumps(sent[3])).every_rank is True
