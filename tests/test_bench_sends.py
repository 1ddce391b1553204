"""`python -m bench.sends`, small: every way of sending runs, queues every message and is
measured."""

import subprocess
import sys

import pytest

from bench.sends import WAYS


@pytest.mark.timeout(120)
def test_the_sends_bench_measures_every_way_and_queues_every_message() -> None:
    # Through the door a user uses: the module run as a program.
    done = subprocess.run(
        [sys.executable, "-m", "bench.sends", "--rounds", "1", "--messages", "50"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    # It asserts that each way queued every message it sent: a lost one fails the run.
    assert done.returncode == 0, done.stdout + done.stderr
    medians = [line.split() for line in done.stdout.splitlines() if "of CPU per message (" in line]
    assert [line[0] for line in medians] == list(WAYS), done.stdout
    assert all(float(line[1]) > 0 for line in medians), done.stdout
