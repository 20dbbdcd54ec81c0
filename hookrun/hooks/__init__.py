"""Hooks on a model: the plan (which modules), hook types, the session that owns the handles,
events, actions, ops, patching and the in-memory capture. It may import config/ and
store/ (records and the file schema); never HDF5 writing, never analysis/.

    from hookrun.hooks.memory import capture        # also hookrun.capture
    with capture(model, {"f": {"at": "layer1.*", "type": "forward"}}) as cap:
        model(x)
"""
