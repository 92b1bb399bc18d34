from mimo.cli import main

main()
