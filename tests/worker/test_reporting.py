"""`scrub` and the breadcrumb filter drop from a Sentry event whatever may carry content.

These are unit tests of the two filters on events built as sentry-sdk builds them. That Sentry is
started in the worker's processes and the dispatcher, hears of each dead letter once, tagged with
its ids, never of a retry, and receives no content or password is tested through real processes
sending to a Sentry server on the loopback, in `test_leaks.py`.
"""

import logging
import sys
import uuid
from typing import Any

from sentry_sdk.utils import event_from_exception

from actonce.worker.observers.sentry import DROPPED, _plain_breadcrumb, scrub

SECRET = f"message-content-{uuid.uuid4().hex}"
"""What an action wrote, held where an event gathers data."""


class LibraryError(Exception):
    """A library's error, whose message quotes what it failed on."""


def _event_of(error: BaseException) -> dict[str, Any]:
    """The event sentry-sdk makes of `error`, with frame variables, as its default options do."""
    try:
        raise error
    except BaseException:
        event, _hint = event_from_exception(sys.exc_info())  # frame variables included
    return dict(event)


def _act(message_content: str) -> None:
    artifact_data = {"entries": {"k": message_content}}  # noqa: F841 - a frame's local
    raise LibraryError(f"member 'x' not found in {{'k': {message_content!r}}}")


def test_a_librarys_message_frame_variables_extra_request_and_contexts_are_dropped() -> None:
    # Given the event of a library's error raised in a frame holding content
    try:
        _act(SECRET)
    except LibraryError as error:
        event = _event_of(error)
    event["extra"] = {"celery-job": {"kwargs": {"text": SECRET}}}
    event["request"] = {"url": "http://app/run", "data": {"content": SECRET}}
    event["contexts"] = {"runtime": {"name": "CPython"}, "artifact": {"data": SECRET}}
    assert SECRET in repr(event), "the event under test holds no content"

    scrubbed = scrub(event, {})  # type: ignore[arg-type]

    # Then no content is left, and what says where it failed is
    assert scrubbed is not None
    assert SECRET not in repr(scrubbed)
    [exception] = scrubbed["exception"]["values"]
    assert exception["type"] == "LibraryError"
    assert exception["value"] == DROPPED
    assert any(frame["function"] == "_act" for frame in exception["stacktrace"]["frames"])
    assert scrubbed["contexts"] == {"runtime": {"name": "CPython"}}


def test_actonces_own_exception_keeps_its_message_of_ids_and_codes() -> None:
    from actonce.tasks.attempt import RunDeadLettered

    event = _event_of(RunDeadLettered("attempts_exhausted: run fir_1 of demo:work"))

    scrubbed = scrub(event, {})  # type: ignore[arg-type]

    assert scrubbed is not None
    [exception] = scrubbed["exception"]["values"]
    assert exception["value"] == "attempts_exhausted: run fir_1 of demo:work"


def test_a_log_lines_arguments_and_breadcrumbs_data_are_dropped() -> None:
    event: dict[str, Any] = {
        "logentry": {"message": "could not post %s", "params": [SECRET], "formatted": SECRET},
        "breadcrumbs": {"values": [{"message": "called post", "data": {"args": SECRET}}]},
    }

    scrubbed = scrub(event, {})  # type: ignore[arg-type]

    assert scrubbed is not None
    assert scrubbed["logentry"] == {"message": "could not post %s"}
    assert SECRET not in repr(scrubbed)


def test_a_log_lines_breadcrumb_is_its_template() -> None:
    record = logging.LogRecord("lib", logging.INFO, __file__, 1, "posted %s", (SECRET,), None)
    crumb = {"message": f"posted {SECRET}", "data": {"args": SECRET}, "category": "lib"}

    kept = _plain_breadcrumb(crumb, {"log_record": record})

    assert kept == {"message": "posted %s", "category": "lib"}
