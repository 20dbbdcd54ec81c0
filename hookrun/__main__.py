from hookrun.cli.app import main

main()
