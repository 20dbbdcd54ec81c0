"""`python -m hookrun.modules [OVERRIDES] [--match GLOB]`, and `hookrun.modules(model, example)`.

    python -m hookrun.modules model=resnet50 --match 'layer1.**'
    print(hookrun.modules(model, x))

The entry point; the code is in hookrun.cli.modules (the command) and hookrun.capture.lister (the
table). The module itself is callable, so `import hookrun.modules` keeps `hookrun.modules(...)`
working.
"""

import sys
import types

from hookrun.capture.lister import list_modules
from hookrun.cli.modules import main


class _CallableModule(types.ModuleType):
    def __call__(self, model, example=None, match=None):
        return list_modules(model, example, match)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
