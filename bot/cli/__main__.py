"""`python -m bot.cli`: the same command line as the `kernelbot` script."""

from bot.cli.app import main

main()
