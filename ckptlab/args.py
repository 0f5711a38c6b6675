"""What every command line shares, below the layers that run one: argparse types with one
message each, the usage error, and argparse's error() made one line.

    p.add_argument("--heads", type=positive_int)      # "expected an integer >= 1, got 0"
    with one_line_errors(): ...                       # argparse errors raise UsageError
    return run_command(main_body, argv)               # one line on stderr, exit status 2

`python -m ckptlab` (ckptlab.cli.main) and `python -m ckptlab.torch.demo` use them, so a
mistake reads the same in every command.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys


class UsageError(Exception):
    """A mistake on the command line, reported as one line (exit status 2)."""


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (not nan, not inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _one_line_error(self, message):
    """argparse's error(), but one line (no usage block): the reason, and where help is."""
    raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


@contextlib.contextmanager
def one_line_errors():
    """Every ArgumentParser in the process (ours and the subcommands') reports one line while
    the block runs; argparse documents overriding error() for exactly this."""
    saved = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _one_line_error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = saved


def run_command(body, argv, errors: tuple = ()) -> int:
    """body(argv) as a command: a UsageError (or one of `errors`) is one line on stderr and
    exit status 2; a SystemExit (--help) keeps its status."""
    try:
        with one_line_errors():
            return int(body(argv) or 0)
    except (UsageError, *errors) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
