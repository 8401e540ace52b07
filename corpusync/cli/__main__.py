"""`python -m corpusync.cli`: the console script."""

from corpusync.cli import run

run()
