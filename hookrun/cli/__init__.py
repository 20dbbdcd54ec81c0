"""The terminal: the Hydra app (`python -m hookrun`, app.py, with Hydra's errors in one line in
hydra_errors.py), `python -m hookrun.inspect`, `python -m hookrun.plot` (figures.py draws) and
`python -m hookrun.modules`. The one place that knows Hydra's app; it may import everything."""
