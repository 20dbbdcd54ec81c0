"""The terminal: the Hydra app (`python -m hookrun`), `python -m hookrun.inspect` and
`python -m hookrun.plot`. The one place that knows Hydra's app; it may import everything."""
