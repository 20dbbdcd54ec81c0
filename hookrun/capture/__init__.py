"""Hooks on a model: the plan (which modules), hook types, the session that owns the handles,
events, actions, ops, patching and the in-memory capture. It may import config/ and
store/records; never HDF5 writing.

    with hookrun.capture(model, {"f": {"at": "layer1.*", "type": "forward"}}) as cap:
        model(x)

The package itself is callable: `hookrun.capture(...)` is `hookrun.capture.memory.capture(...)`
(hookrun/__init__.py imports that module), so the name serves both as the folder and as the
notebook entry point.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, model, hooks, **kwargs):
        return self.memory.capture(model, hooks, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
