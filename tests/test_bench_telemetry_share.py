"""`python -m bench.telemetry_share` counts the pool's busy samples spent in telemetry's code, from
py-spy's raw output, leaving out the bench's own process and what a process pays once to start."""

import subprocess
import sys
from pathlib import Path

_BENCH = 'process 10:"python -m bench.bench --contenders pool2-otel"'
_WORKER = 'process 11:"python -m actonce.worker.cli worker -P prefork -c 2"'
_CHILD = 'process 12:"python -m actonce.worker.cli worker -P prefork -c 2"'
_DISPATCHER = 'process 13:"python -m actonce.worker.cli dispatch"'
_ATTEMPT = "attempt_run (actonce/tasks/attempt.py:40)"

_RAW = "\n".join(
    [
        # a child's attempt: 9 samples of work, 1 of them ending a span, 2 exporting spans
        f"{_BENCH};{_WORKER};{_CHILD};{_ATTEMPT};execute (sqlalchemy/engine/base.py:10) 6",
        f"{_BENCH};{_WORKER};{_CHILD};{_ATTEMPT};Span.end (sdk/trace/__init__.py:900) 1",
        f"{_BENCH};{_WORKER};{_CHILD};run (threading.py:1010);"
        "ScrubbedSpans.export (actonce/worker/process/exporting.py:88);"
        "OTLPSpanExporter.export (exporter/otlp/proto/http/trace_exporter/__init__.py:179) 2",
        # a loop waiting in epoll is idle, left out
        f"{_BENCH};{_WORKER};{_CHILD};{_ATTEMPT};EpollSelector.select (selectors.py:468) 5",
        # the dispatcher: 3 samples sending, 1 recording a metric, 4 importing the SDK at start
        f"{_BENCH};{_DISPATCHER};send (actonce/worker/dispatching/dispatcher.py:600) 3",
        f"{_BENCH};{_DISPATCHER};Counter.add (metrics/_internal/instrument.py:210) 1",
        f"{_BENCH};{_DISPATCHER};start (actonce/worker/process/telemetry.py:88);"
        "_find_and_load (<frozen importlib._bootstrap>:1360) 4",
        # the bench's own process is not the pool's
        f"{_BENCH};Counter.add (metrics/_internal/instrument.py:210) 7",
    ]
)


def test_the_share_counts_the_pools_steady_samples_in_telemetrys_code(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(_RAW + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "bench.telemetry_share", str(raw)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = {line[:22].strip(): line[22:].split() for line in done.stdout.splitlines()[1:4]}
    assert rows["celery:children"][:3] == ["9", "3", "33.3%"], done.stdout
    assert rows["dispatcher"] == ["4", "1", "25.0%", "(4:", "4)"], done.stdout
    assert rows["the pool"] == ["13", "4", "30.8%"], done.stdout
    assert "2  ScrubbedSpans.export (actonce/worker/process/exporting.py)" in done.stdout


def test_a_profile_without_the_pool_says_so(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(f"{_BENCH};Counter.add (metrics/_internal/instrument.py:210) 7\n")
    done = subprocess.run(
        [sys.executable, "-m", "bench.telemetry_share", str(raw)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no busy samples of a pool's process" in done.stderr
