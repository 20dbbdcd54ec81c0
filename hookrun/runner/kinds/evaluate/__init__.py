"""The evaluate kind, whole: its block and refusals (block.py), forwards (kind.py), metrics
(metrics.py), ablations (ablations.py), its table under /evaluation (table.py) and
what readers show of it (reader.py). Importing the folder registers the kind, its table (store/records.py)
and its reader (analysis/kind_readers.py)."""

from hookrun.runner.kinds.evaluate import reader, table  # noqa: F401  (they register themselves)
from hookrun.runner.kinds.evaluate.kind import EvaluateKind

__all__ = ["EvaluateKind"]
