"""The bench's machine reading counts what every process on the machine spent, not only the
bench's: a process outside the bench that spins a core shows in the window's busy share."""

import subprocess
import sys
import time

import psutil
import pytest

from bench.measure import machine

_SPIN = """
import sys, time
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
"""


@pytest.mark.timeout(60)
def test_a_spinning_process_shows_in_the_machines_busy_seconds() -> None:
    before = machine()
    spinner = subprocess.Popen([sys.executable, "-c", _SPIN, "1.5"])
    watched = psutil.Process(spinner.pid)
    spent = 0.0
    while spinner.poll() is None:
        try:
            times = watched.cpu_times()
        except psutil.NoSuchProcess:
            break
        spent = times.user + times.system
        time.sleep(0.05)
    spinner.wait(30)
    after = machine()
    # The spinner burned about 1.5 s of CPU; the machine was busy at least that long, give or
    # take the kernel's tick, whatever else ran meanwhile.
    assert spent >= 1.0
    assert after.busy_s - before.busy_s >= spent - 0.1, (after, before, spent)
    share = after.busy_share(before)
    cores = psutil.cpu_count() or 1
    assert spent / ((after.at - before.at) * cores) - 0.05 <= share <= 1.0, share
