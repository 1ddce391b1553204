"""`python -m bench.profile` summarizes py-spy's raw output of the bench's process tree: each
process kind's busy samples, the packages running, and the innermost lattice frame."""

import subprocess
import sys
from pathlib import Path

_BENCH = 'process 10:"python -m bench.bench --contenders pool2"'
_WORKER = 'process 11:"python -m actonce.worker.cli worker -P prefork -c 2"'
_CHILD = 'process 12:"python -m actonce.worker.cli worker -P prefork -c 2"'
_DISPATCHER = 'process 13:"python -m actonce.worker.cli dispatch"'

_RAW = "\n".join(
    [
        # a child's attempt: 6 samples under reflexr's storage, in SQLAlchemy
        f"{_BENCH};{_WORKER};{_CHILD};attempt_run (actonce/tasks/attempt.py:40);"
        "_Transaction.read (reflexr/sql/storage.py:300);execute (sqlalchemy/engine/base.py:10) 6",
        # 2 of its samples were a loop waiting in epoll: idle, left out
        f"{_BENCH};{_WORKER};{_CHILD};attempt_run (actonce/tasks/attempt.py:40);"
        "run_forever (asyncio/base_events.py:600);EpollSelector.select (selectors.py:468) 2",
        f"{_BENCH};{_WORKER};{_CHILD};attempt_run (actonce/tasks/attempt.py:40);"
        "_write (actonce/tasks/outbound.py:90);send (asyncio/selector_events.py:1071) 2",
        # the worker's main process, publishing events
        f"{_BENCH};{_WORKER};publish (kombu/messaging.py:170) 1",
        # the dispatcher sending
        f"{_BENCH};{_DISPATCHER};send_attempt (actonce/worker/dispatching/dispatcher.py:600);"
        "send_task (celery/app/base.py:800) 3",
    ]
)


def _summarize(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.profile", str(path), "--top", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_summary_names_each_process_kind_and_where_its_time_goes(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(_RAW + "\n")
    done = _summarize(raw)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "== celery:children: 8 busy samples (67% of all)", done.stdout
    assert "sqlalchemy 75%" in lines[1] and "asyncio 25%" in lines[1], lines[1]
    assert "75.0%  execute (sqlalchemy/engine/base.py)" in lines[3], lines[3]
    assert "25.0%  send (asyncio/selector_events.py)" in lines[4], lines[4]
    assert "75.0%  _Transaction.read (reflexr/sql/storage.py)" in done.stdout
    assert "25.0%  _write (actonce/tasks/outbound.py)" in done.stdout
    assert "== dispatcher: 3 busy samples (25% of all)" in done.stdout
    assert "100.0%  send_attempt (actonce/worker/dispatching/dispatcher.py)" in done.stdout
    assert "== celery: 1 busy samples (8% of all)" in done.stdout


def test_a_file_that_is_not_a_raw_profile_is_refused_with_the_reason(tmp_path: Path) -> None:
    not_raw = tmp_path / "profile.svg"
    not_raw.write_text("<svg></svg>\n")
    done = _summarize(not_raw)
    assert done.returncode == 1
    assert "no busy samples" in done.stderr and "-f raw" in done.stderr
    missing = _summarize(tmp_path / "absent.txt")
    assert missing.returncode == 2 and "cannot read the profile" in missing.stderr
