"""`python -m corpusync.cli`: the console script."""

from corpusync.cli import run

if __name__ == "__main__":  # not on import (tools that walk every module import this one too)
    run()
