from frostc.cli import main

main()
