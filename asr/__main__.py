"""`python -m asr`: the `asr` command (`asr.cli`), for where the entry point is not on PATH."""

import sys

from asr.cli import main

if __name__ == "__main__":
    sys.exit(main())
