from rayflow.cli import main

main()
