"""`python -m ckptlab`: the command line (ckptlab.cli.main says what each command does)."""

from ckptlab.args import exit_with
from ckptlab.cli.main import main

if __name__ == "__main__":
    exit_with(main)
