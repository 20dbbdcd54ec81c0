"""Where and how a run is written, below the runner: the destination (a local file or object-store
parts), its lock, resume (local and parts), ranks and their shards, and the clean stops on signals.
The object-store scheme is one folder, objects/ (writer, lock, resume, source and the reader
RemoteRun), loaded only through store/schemes.py. It imports config/, store/, analysis/ (RemoteRun
is a Run) and errors; the runner (hookrun/runner/) asks it and never asks which destination it has."""
