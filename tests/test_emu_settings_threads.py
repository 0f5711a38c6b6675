"""The emulator's settings: each thread's `with emu.settings(...)` is its own (overlapping blocks
in threads leave no thread, and not the process, in another's settings); emu.DEFAULT resets a
setting to its built-in default whatever CKPTLAB_EMU_* says; race_check and block_seed are
checked when they are set, with a message naming the setting."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from ckptlab import emu

SRC = r"""
extern "C" __global__ void where(int* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = blockIdx.x;
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=SRC, name="threads.cu")


def in_a_new_thread(fn):
    """What fn() returns in a thread that never opened a settings block."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_overlapping_settings_blocks_in_threads_stay_in_their_thread(mod):
    """Eight threads in settings(workers=3) and one in fast mode, their blocks all open at once
    and closed in an order unlike the one they opened in: each sees and launches with its own,
    and afterwards the process's settings (a new thread's) and this thread's are as before."""
    fn = mod.get_function("where")
    process_before, mine_before = in_a_new_thread(emu.current), emu.current()
    n = 9
    opened, checked = threading.Barrier(n), threading.Barrier(n)
    seen, errors = [None] * n, []

    def run(i):
        asked = dict(mode="fast", workers=1) if i == 4 else dict(workers=3)
        try:
            with emu.settings(**asked):
                opened.wait(timeout=60)  # every block is open now
                out = np.full(8 * 32, -1, np.int32)
                launch = fn((8,), (32,), (out,))
                seen[i] = (emu.current().mode, emu.current().workers, launch.mode,
                           launch.workers, bool((out == np.repeat(np.arange(8), 32)).all()))
                checked.wait(timeout=60)
                threading.Event().wait(0.01 * ((i * 5) % n))  # close in a shuffled order
        except Exception as e:  # noqa: BLE001 (reported below, with its thread)
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, s in enumerate(seen):
        mode = process_before.mode  # a new thread starts from the process's settings
        want = ("fast", 1, "fast", 1, True) if i == 4 else (mode, 3, mode, 3, True)
        assert s == want, (i, s)
    assert in_a_new_thread(emu.current) == process_before
    assert emu.current() == mine_before


def test_configure_inside_a_block_ends_with_it_and_outside_changes_the_process():
    before = emu.current()
    with emu.settings(watchdog_s=7.0):
        previous = emu.configure(watchdog_s=9.0)
        assert previous.watchdog_s == 7.0 and emu.current().watchdog_s == 9.0
        assert in_a_new_thread(lambda: emu.current().watchdog_s) != 9.0  # not the process's
    assert emu.current() == before
    process = in_a_new_thread(emu.current)

    def set_process():  # a thread outside any block changes what every such thread sees
        return emu.configure(stack_kib=process.stack_kib + 8)

    try:
        in_a_new_thread(set_process)
        assert in_a_new_thread(emu.current).stack_kib == process.stack_kib + 8
    finally:
        in_a_new_thread(lambda: emu.configure(stack_kib=process.stack_kib))
    assert in_a_new_thread(emu.current) == process


def test_default_resets_a_setting_to_its_built_in_value():
    built_in = emu.Settings()
    with emu.settings(workers=3, block_order="shuffled", block_seed=11, stack_kib=128):
        with emu.settings(workers=None, block_seed=None):  # None: unchanged
            assert (emu.current().workers, emu.current().block_seed) == (3, 11)
        with emu.settings(workers=emu.DEFAULT, block_seed=emu.DEFAULT, stack_kib=emu.DEFAULT):
            s = emu.current()
            assert (s.workers, s.block_seed, s.stack_kib) == (
                built_in.workers, built_in.block_seed, built_in.stack_kib) == (None, None, 64)
            assert s.block_order == "shuffled"  # the others stay as they were
        emu.configure(workers=emu.DEFAULT)
        assert emu.current().workers is None
    assert repr(emu.DEFAULT) == "ckptlab.emu.DEFAULT"


def test_default_ignores_the_environment():
    """CKPTLAB_EMU_WORKERS=3 presets the process; DEFAULT still means automatic workers."""
    code = ("from ckptlab import emu\n"
            "print(emu.current().workers, emu.current().stack_kib)\n"
            "with emu.settings(workers=emu.DEFAULT, stack_kib=emu.DEFAULT):\n"
            "    print(emu.current().workers, emu.current().stack_kib)\n")
    env = dict(os.environ, CKPTLAB_EMU_WORKERS="3", CKPTLAB_EMU_STACK_KIB="96")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["3", "96", "None", "64"], out.stderr


@pytest.mark.parametrize("changes, message", [
    (dict(race_check="no"), r"race_check must be True or False, got 'no'"),
    (dict(race_check=0.5), r"race_check must be True or False, got 0.5"),
    (dict(race_check=0), r"race_check must be True or False, got 0"),
    (dict(block_seed="x"), r"block_seed must be None \(a fresh order each launch\) or an int "
                           r"in \[0, 2\*\*64\), got 'x'"),
    (dict(block_seed=1.5), r"block_seed must be None .*got 1.5"),
    (dict(block_seed=True), r"block_seed must be None .*got True"),
    (dict(block_seed=-1), r"block_seed must be None .*got -1"),
    (dict(block_seed=1 << 64), r"block_seed must be None .*got 18446744073709551616"),
])
def test_race_check_and_block_seed_are_checked_when_set(changes, message):
    before = emu.current()
    with pytest.raises(ValueError, match=message):
        with emu.settings(**changes):
            pass
    with pytest.raises(ValueError, match=message):
        emu.configure(**changes)
    assert emu.current() == before  # a refused value changes nothing


def test_good_race_check_and_block_seed_values_are_taken():
    with emu.settings(race_check=False, block_seed=0):
        assert (emu.current().race_check, emu.current().block_seed) == (False, 0)
    with emu.settings(block_seed=(1 << 64) - 1):
        assert emu.current().block_seed == (1 << 64) - 1


def test_an_unknown_setting_is_named():
    with pytest.raises(TypeError, match="unknown emulator setting.*worker.*expected some of"):
        with emu.settings(worker=3):
            pass
