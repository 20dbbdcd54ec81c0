"""The notebook API: a config's hooks on a model you hold, records kept in memory (`capture.py`, with
its own step loop in `steps.py`: each call of the model is a step), and every name `at:` accepts (`lister.py`).
Both are bound at the top: `hookrun.capture`, `hookrun.modules`.

    with hookrun.capture(model, {"f": {"at": "layer1.*", "type": "forward"}}) as cap:
        model(x)
    print(hookrun.modules(model, x, match="layer1.*"))
"""
