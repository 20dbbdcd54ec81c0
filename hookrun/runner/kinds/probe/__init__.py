"""The probe kind: one linear probe per hook point, fitted from one pass over the data (docs/probe.md).

    from hookrun.runner.kinds.probe.fit import FitSpec, fit_point   # the engine, on rows already pooled
"""
