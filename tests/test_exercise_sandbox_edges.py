"""The sandbox's edges a plain learner's file does not reach: a message behind the right nonce
that is not a report is no verdict, and a checkpoint() that turns the child's own watchdog off
and never returns is still stopped, by the parent's limit on the whole check."""

from __future__ import annotations

import pickle
import time

import pytest
from test_exercise_sandbox import IN_FORWARD, checkpoint_with

from ckptlab.exercises import write
from ckptlab.exercises.write import sandbox
from ckptlab.exercises.write.check import FAULT, RIGHT, Report


@pytest.mark.parametrize("body", [[RIGHT], {"status": RIGHT}, "right", 0])
def test_a_message_with_the_nonce_that_is_no_report_is_void(body):
    """Only a Report is a verdict: anything else behind the nonce (Python that read it could
    send one) is a fault, never returned as if it were the verdict."""
    nonce = b"n" * sandbox.NONCE_BYTES
    report = sandbox._verdict([nonce + pickle.dumps(body)], nonce, "checkpoint")
    assert isinstance(report, Report) and report.status == FAULT, report
    assert report.pattern == "forged"


def test_a_verdict_behind_a_nonce_one_byte_off_is_void():
    """A verdict is taken only behind every byte of the nonce drawn for its check."""
    good = Report("checkpoint", RIGHT, ["right"])
    nonce = b"\x01" * sandbox.NONCE_BYTES
    assert sandbox._verdict([nonce + pickle.dumps(good)], nonce, "checkpoint").ok
    guessed = b"\x01" * (sandbox.NONCE_BYTES - 1) + b"\x02"
    assert not sandbox._verdict([guessed + pickle.dumps(good)], nonce, "checkpoint").ok


@pytest.mark.slow
def test_a_checkpoint_that_turns_the_watchdog_off_is_stopped_by_the_parent(tmp_path):
    """faulthandler's watchdog cancelled, then a sleep that never ends: the parent stops the
    child at its limit for the Python exercise (a few times the watchdog's), with a line that
    says so; not a check that runs for ever."""
    path = checkpoint_with(tmp_path, IN_FORWARD, "import faulthandler, time\n"
                           "faulthandler.cancel_dump_traceback_later()\ntime.sleep(10 ** 6)")
    start = time.monotonic()
    report = write.check("checkpoint", file=path)
    took = time.monotonic() - start
    assert report.status == FAULT and "did not finish" in str(report), str(report)
    assert took < sandbox.PYTHON_LIMIT_S + 20 < 60, took
