"""Sentry hears of dead letters once, never of retries, and never receives content.

Sentry is started by `worker.reporting.init_sentry`, as a worker starts it, with a transport that
keeps every envelope in a list instead of sending it: what the list holds is exactly what would
leave the process. A dead letter is one event tagged with its rule, reason, tenant, workspace and
run; a Celery `Retry`, raised by a real task run eagerly through Celery's tracer, is no event,
while the same task failing is; and a secret held by local variables, extra data, a request, a
context, breadcrumbs and log lines appears nowhere in the serialized envelopes.
"""

import asyncio
import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sentry_sdk
from celery import Celery
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport
from sentry_sdk.utils import event_from_exception

from actonce.worker.dead_letters import DeadLetter, InMemoryDeadLetters, run_letter_id
from actonce.worker.reporting import init_sentry, report_dead_letter
from actonce.worker.settings import Settings

DSN = "http://public@127.0.0.1:1/1"
"""A DSN nothing listens on: the recording transport sends nothing anyway."""


class Recording(Transport):
    """A transport that keeps every envelope instead of sending it."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        """The error and message events sent so far."""
        sentry_sdk.flush()
        return [
            item.payload.json
            for envelope in self.envelopes
            for item in envelope.items
            if item.type == "event" and item.payload.json is not None
        ]

    def sent(self) -> bytes:
        """Every envelope, serialized as it would go over the wire."""
        sentry_sdk.flush()
        return b"".join(envelope.serialize() for envelope in self.envelopes)


@pytest.fixture
def sentry() -> Iterator[Recording]:
    """Sentry started as a worker starts it, recording; stopped after the test."""
    transport = Recording()
    settings = Settings.from_env({}, sentry_dsn=DSN, sentry_environment="test")
    assert init_sentry(settings, transport=transport)
    try:
        yield transport
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.init()  # no DSN: an inactive client, so other tests report nothing


def _letter(*, error: str = "Forbidden: demo:work may not edit art_x") -> DeadLetter:
    return DeadLetter(
        id=run_letter_id("acme", "ws_1", "fir_1", 2),
        tenant_id="acme",
        workspace_id="ws_1",
        run_id="fir_1",
        rule="demo:work",
        reason="forbidden",
        error=error,
        attempts=2,
        task_id="task-1",
        queue="actonce.attempts",
        dead_at=datetime.now(UTC),
    )


def test_without_a_dsn_sentry_does_not_start() -> None:
    assert not init_sentry(Settings.from_env({}))


def test_a_dead_letter_is_reported_once_tagged_with_its_ids(sentry: Recording) -> None:
    report_dead_letter(_letter())

    [event] = sentry.events()
    assert event["level"] == "warning"
    assert (
        event["tags"].items()
        >= {
            "dead_letter": "true",
            "rule": "demo:work",
            "reason": "forbidden",
            "tenant_id": "acme",
            "workspace_id": "ws_1",
            "run_id": "fir_1",
        }.items()
    )
    assert event["fingerprint"] == ["actonce-dead-letter", "demo:work", "forbidden"]


def test_a_dead_letter_delivered_twice_is_kept_and_reported_once(sentry: Recording) -> None:
    letters = InMemoryDeadLetters()

    async def dead_letter_each_delivery() -> None:
        # As the attempt task does: report only the letter the store did not have.
        for _delivery in range(2):
            if await letters.add(_letter()):
                report_dead_letter(_letter())

    asyncio.run(dead_letter_each_delivery())

    assert len(sentry.events()) == 1


def test_a_dead_letters_error_text_is_not_sent(sentry: Recording) -> None:
    secret = f"customer-said-{uuid.uuid4().hex}"

    report_dead_letter(_letter(error=f"failed while posting {secret!r}"))

    assert len(sentry.events()) == 1
    assert secret.encode() not in sentry.sent()


def test_a_celery_retry_is_not_reported_but_a_failure_of_the_same_task_is(
    sentry: Recording,
) -> None:
    # Given a real task, run eagerly through Celery's tracer, which sentry's integration wraps
    celery = Celery("reporting-test", broker="memory://", backend="cache+memory://")
    celery.conf.task_always_eager = True

    @celery.task(bind=True, name="reporting.flaky", max_retries=1)
    def flaky(self: Any, fail: bool) -> str:
        if fail:
            raise RuntimeError("the broker went away")
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "done"

    # When it retries once and then succeeds
    assert flaky.apply(args=(False,)).get() == "done"

    # Then nothing is reported
    assert sentry.events() == []

    # And when it fails instead, the failure is reported: the integration is on this path
    assert flaky.apply(args=(True,)).failed()
    [event] = sentry.events()
    assert event["exception"]["values"][-1]["type"] == "RuntimeError"
    assert event["tags"]["celery_task_id"]


def test_no_message_content_artifact_data_or_tool_arguments_leave_the_process(
    sentry: Recording,
) -> None:
    secret = f"message-content-{uuid.uuid4().hex}"
    library = logging.getLogger("some.library")

    def act(message_content: str) -> None:
        artifact_data = {"entries": {"k": message_content}}  # noqa: F841 - a frame's local
        tool_arguments = {"text": message_content}  # noqa: F841 - a frame's local
        raise RuntimeError("the action failed")

    # Breadcrumbs: one with data, and log lines below the event level that become breadcrumbs
    sentry_sdk.add_breadcrumb(category="tool", message="called post", data={"args": secret})
    library.info("posting %s", secret)
    library.warning("posted %s", secret)
    with sentry_sdk.new_scope() as scope:
        scope.set_extra("message", secret)
        scope.set_context("artifact", {"data": {"entries": {"k": secret}}})
        try:
            act(secret)
        except RuntimeError:
            client = sentry_sdk.get_client()
            event, hint = event_from_exception(sys.exc_info(), client_options=client.options)
            event["request"] = {"url": "http://app/run", "data": {"content": secret}}
            event["extra"] = {"tool_arguments": {"text": secret}}
            sentry_sdk.capture_event(event, hint=hint)
        # A log line at error level becomes an event of its own
        library.error("could not post %s", secret)

    assert len(sentry.events()) == 2, "the events under test were not all sent"
    assert secret.encode() not in sentry.sent()
