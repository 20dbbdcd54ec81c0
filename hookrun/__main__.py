from hookrun.cli import main

main()
