"""Where and how a run is written, below the runner: the destination (a local file or object-store
parts), its lock, resume (local and parts), ranks and their shards, and the clean stops on signals.
It imports config/, store/ and errors; the runner (hookrun/runner/) asks it and never asks which
destination it has."""
