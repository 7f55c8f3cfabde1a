"""`python -m tvmrnn` is the `tvmrnn` command."""

from .cli import main

main()
