"""What a `Runtime.run` call leaves running: cancelled as it returns on a prefork child's loop,
which runs only during calls; carried on by a threaded runtime's loop, which runs between them.

Left on a loop that stops, a task (artifactr's Runner looks at a thread again a `claim_ttl` on)
would freeze until some later call, maybe another task's, and wake inside it: a turn it started
there would freeze in turn once that call returned, its claim lapsing and its reply unposted.
"""

import asyncio
import time
from pathlib import Path

import pytest

from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings


def _runtime(tmp_path: Path, *, threaded: bool) -> Runtime:
    settings = Settings.from_env(
        {"ACTONCE_APP": "demo.definition:app", "ACTONCE_VAR_DIR": str(tmp_path / "var")}
    )
    return Runtime(settings, load_definition(settings.app), one_run=True, threaded=threaded)


async def _start_a_look(seen: list[str], kept: list["asyncio.Task[None]"]) -> None:
    """Start a task that records `looked` 0.2 s on (or `cancelled`), and return at once."""

    async def look() -> None:
        try:
            await asyncio.sleep(0.2)
            seen.append("looked")
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    kept.append(asyncio.get_running_loop().create_task(look()))
    await asyncio.sleep(0)  # the look is under way, in its sleep, as the Runner's would be


def test_a_prefork_runtime_cancels_what_a_call_left_running_before_it_returns(
    tmp_path: Path,
) -> None:
    runtime = _runtime(tmp_path, threaded=False)
    seen: list[str] = []
    kept: list[asyncio.Task[None]] = []
    try:
        # When a call returns, leaving a task that would look again 0.2 s on
        runtime.run(_start_a_look(seen, kept))
        # Then it was cancelled, and unwound, before the call returned
        assert kept[0].cancelled() and seen == ["cancelled"]
        # and it does not wake inside the next call, which outlasts it
        runtime.run(asyncio.sleep(0.4))
        assert "looked" not in seen
    finally:
        runtime.close()


def test_a_threaded_runtime_carries_on_what_a_call_left_running(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path, threaded=True)
    seen: list[str] = []
    kept: list[asyncio.Task[None]] = []
    try:
        # When a call returns, leaving a task that looks again 0.2 s on
        runtime.run(_start_a_look(seen, kept))
        # Then the loop carries it on with no further call
        deadline = time.monotonic() + 10
        while seen != ["looked"]:
            assert time.monotonic() < deadline, f"the look never ran: {seen}"
            time.sleep(0.05)
    finally:
        runtime.close()


@pytest.mark.parametrize("threaded", [False, True])
def test_a_calls_result_and_its_error_come_back_either_way(tmp_path: Path, threaded: bool) -> None:
    runtime = _runtime(tmp_path, threaded=threaded)

    async def fail() -> None:
        raise LookupError("from the coroutine")

    try:
        assert runtime.run(asyncio.sleep(0, "result")) == "result"
        with pytest.raises(LookupError, match="from the coroutine"):
            runtime.run(fail())
    finally:
        runtime.close()
