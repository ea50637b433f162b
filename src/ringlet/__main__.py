from ringlet.cli import main

main()
