"""`python -m ckptlab`: the command line (ckptlab.cli.main says what each command does)."""

import sys

from ckptlab.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
