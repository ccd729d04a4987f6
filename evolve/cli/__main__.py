from evolve.cli import main

main()
