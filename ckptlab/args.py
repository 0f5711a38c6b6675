"""What every command line shares, below the layers that run one: argparse types with one
message each, the usage error, argparse's error() made one line, and one rule for output.

    p.add_argument("--heads", type=positive_int)      # "expected an integer >= 1, got 0"
    with one_line_errors(): ...                       # argparse errors raise UsageError
    return run_command(main_body, argv)               # the rule below, as a status
    if __name__ == "__main__": exit_with(main)        # the same for the process

The rule, for every command: a usage error (a bad option, an output path that cannot be
written, a size that cannot fit) is one line on stderr and exit status 2, before any work; a
write error once the work ran (a full disk: `--csv /dev/full`) is one line and status 1; output
piped into a reader that stops early (`| head`) ends quietly, status 1. `python -m ckptlab`
(ckptlab.cli.main), `python -m ckptlab.torch.demo` and the bench/*.py scripts follow it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
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


def os_error_line(e: OSError) -> str:
    """An OSError as one line: the file it names, and the system's reason."""
    reason = e.strerror or str(e) or type(e).__name__
    return f"{e.filename}: {reason}" if e.filename else reason


def _flush_or_silence() -> None:
    """Flush stdout; if that fails (a closed pipe, a full disk), point file
    descriptor 1 at /dev/null, so that the interpreter's last flush at exit does not fail again
    (Python's documentation, "Note on SIGPIPE", in the signal module); only the process's own
    stdout, never one a caller set (a test's capture)."""
    try:
        sys.stdout.flush()
        return
    except (OSError, ValueError):
        pass
    if sys.stdout is sys.__stdout__ and sys.__stdout__ is not None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.__stdout__.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


def _emulator_refusals() -> tuple:
    """The emulator's CompilerUnusable (no compiler here can build it), a usage error of the
    machine: looked up, not imported (importing the emulator reads CKPTLAB_EMU_*, which
    ckptlab.cli.main checks first); if the emulator was never imported it was not raised."""
    errors = sys.modules.get("ckptlab.emu.errors")
    return (errors.CompilerUnusable,) if errors is not None else ()


def run_command(body, argv, errors: tuple = ()) -> int:
    """body(argv) as a command, under the rule above: a UsageError (or one of `errors`, or
    the emulator's CompilerUnusable) is one line on stderr and status 2; an OSError (a write
    that failed) one line and status 1; a closed stdout (BrokenPipeError) status 1, silently.
    A SystemExit (--help) keeps its status; one with a message prints it, status 1, as Python
    does."""
    try:
        with one_line_errors():
            return int(body(argv) or 0)
    except (UsageError, *errors, *_emulator_refusals()) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout stopped early: nothing to say
        _flush_or_silence()
        return 1
    except OSError as e:
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        _flush_or_silence()  # stdout itself may be what failed
        return 1
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 1
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


def exit_with(main) -> None:
    """End the process with main()'s status under the rule above: main(argv) runs as
    run_command runs a body (a script's main that does not already), then stdout is flushed
    here, where a closed pipe or a full disk shows last."""
    status = run_command(main, sys.argv[1:])
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        status = status or 1
    except OSError as e:
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        status = status or 1
    _flush_or_silence()
    sys.exit(status)
