"""`python -m hookrun.modules [OVERRIDES] [--match GLOB]`: every name `at:` accepts, with shapes.

    python -m hookrun.modules model=resnet50 --match 'layer1.**'

This file is only the command's entry point (the code is in hookrun.cli.modules_command). The function of
the same name, `hookrun.modules(model, example)`, is hookrun.notebook.lister.list_modules, bound in
hookrun/__init__.py; import it as `from hookrun import modules`.
"""

if __name__ == "__main__":
    from hookrun.cli import exit_process
    from hookrun.cli.modules_command import main

    exit_process(main)
