"""`python -m asr.cli`: the `asr` command, as `python -m asr` runs it."""

import sys

from asr.cli import main

if __name__ == "__main__":  # pytest's doctest collection imports this module
    sys.exit(main())
