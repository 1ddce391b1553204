"""Counts the SQL statements and transactions of every Python process the bench starts.

The bench puts this folder first on `PYTHONPATH` and sets `BENCH_SQL_COUNT_DIR`; Python then
imports this module at startup in each contender process (a prefork child inherits it from its
parent). Every SQLAlchemy engine's statements (`before_cursor_execute`) and transactions
(`begin`) are counted in memory, and a thread writes the counts to `<dir>/<pid>.json` twice a
second when they changed, so the bench sums them without stopping anything. A forked child
starts from zero.
"""

import json
import os
import threading
import time

_DIRECTORY = os.environ.get("BENCH_SQL_COUNT_DIR")

if _DIRECTORY:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    _counts = {"statements": 0, "transactions": 0}
    _owner = {"pid": 0}

    def _flush() -> None:
        path = os.path.join(str(_DIRECTORY), f"{os.getpid()}.json")
        with open(f"{path}.tmp", "w") as out:
            json.dump(_counts, out)
        os.replace(f"{path}.tmp", path)

    def _flushing() -> None:
        pid = os.getpid()
        written: dict[str, int] = {}
        while _owner["pid"] == pid:
            time.sleep(0.5)
            # Unchanged counts are not written again: an idle process of a contender would
            # otherwise pay the bench's bookkeeping twice a second, and the pool has four.
            if _counts != written:
                written = dict(_counts)
                _flush()

    def _here() -> None:
        # The first statement in a process (or in a forked child) starts its flushing thread.
        if _owner["pid"] != os.getpid():
            _owner["pid"] = os.getpid()
            _counts["statements"] = _counts["transactions"] = 0
            threading.Thread(target=_flushing, daemon=True).start()

    def _statement(*_: object) -> None:
        _here()
        _counts["statements"] += 1

    def _begin(*_: object) -> None:
        _here()
        _counts["transactions"] += 1

    event.listen(Engine, "before_cursor_execute", _statement)
    event.listen(Engine, "begin", _begin)
