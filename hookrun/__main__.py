from hookrun.cli.app import process

process()
