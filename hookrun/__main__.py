"""`python -m hookrun [overrides]`: the Hydra app of cli/app.py."""

from hookrun.cli.app import process

process()
