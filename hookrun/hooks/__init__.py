"""Hooks on a model: the plan (which modules), hook types, the session that owns the handles,
events, actions, ops, the patch op, the probe-direction ops. It may import config/, sae/ and store/ (records and the file
schema); never HDF5 writing, never analysis/. The in-memory capture and the module lister,
which drive these hooks from a notebook, are in hookrun/notebook/.

    from hookrun.hooks.plan import make_plan          # the hook points a config's specs name
    from hookrun.hooks.session import HookSession     # owns every handle, removes them in reverse
"""
