"""Sentry: dead letters and infrastructure failures, with ids and never content.

`init_sentry` runs in every worker process when a DSN is set, with sentry-sdk's Celery
integration; `SentryObserver`, one of the lifecycle's observers (`tasks.observers`), reports each
dead letter once (it is told only of a letter a delivery, the intake or the sweep added
it added), tagged with ids and its reason code, never its error text. Retries are control flow and
are never reported. Message content, artifact data and tool arguments must not leave the process,
so `scrub` drops whatever an event gathered that may carry them: extra data (Celery's task
arguments among it), request bodies, frame variables, contexts other than sentry's own
(runtime, os, trace…), breadcrumbs' data, and log lines' arguments: a log line is sent as its
template (`"posted %s"`), never formatted. An exception's message is sent only when the exception
is actonce's own, whose messages name ids and reason codes; any other's (a library's, whose text
may quote the data it failed on: artifactr's `PatchFailed` quotes the artifact, a database error
its statement's parameters) is replaced by `DROPPED`, keeping its type and stack. Actions' errors
never reach Sentry anyway: reflexr records them on the run. Tracing is off (no
`traces_sample_rate`) and the Celery integration propagates no trace headers, so neither spans
nor task messages carry anything of Sentry's.
"""

import logging
from typing import Any, Final

import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.integrations.pydantic_ai import PydanticAIIntegration
from sentry_sdk.types import Event, Hint

from actonce.tasks.observers import (
    AttemptSettled,
    Letter,
    MessageRefused,
    Observer,
    RunLettered,
    TurnSettled,
)
from actonce.worker.settings import Settings

log = logging.getLogger("actonce.reporting")


def init_sentry(settings: Settings, **options: Any) -> bool:
    """Start Sentry in this process if a DSN is set; return whether it started."""
    if not settings.sentry_dsn:
        return False
    sentry_sdk.init(
        dsn=settings.sentry_dsn,
        environment=settings.sentry_environment,
        integrations=[
            # No `sentry-trace`/`baggage` headers in task messages: they stay ids only.
            CeleryIntegration(propagate_traces=False),
            # An error logged is an event: the worker reports an unexpected error by its log
            # line. sentry-sdk 2 did so by default; 3 sends log lines as no event unless told.
            LoggingIntegration(event_level=logging.ERROR),
        ],
        # Auto-enabled where pydantic-ai is installed, it reports each turn whose agent raised:
        # that failure is recorded on the turn's run, as an action's is on its run.
        disabled_integrations=[PydanticAIIntegration()],
        max_request_body_size="never",
        before_send=scrub,
        before_breadcrumb=_plain_breadcrumb,
        **_collecting_nothing(),
        **options,
    )
    return True


def _collecting_nothing() -> dict[str, Any]:
    """The options that keep sentry-sdk from collecting data of its own accord, as its major
    version spells them.

    sentry-sdk 3 replaced `send_default_pii` and `include_local_variables` by `data_collection`,
    which collects most categories unless each is turned off (refusing the old options), and
    sends every log line of INFO and above as a Sentry log, arguments and `extra` data included
    (Celery's task failure line carries the task's arguments): none is sent. `scrub` drops the
    same things again from events, whatever the version collected.
    """
    if int(sentry_sdk.VERSION.split(".", 1)[0]) < 3:
        return {"send_default_pii": False, "include_local_variables": False}
    off = {"mode": "off"}
    return {
        "data_collection": {
            "user_info": False,
            "cookies": off,
            "http_headers": {"request": off},
            "http_bodies": [],
            "url_query_params": off,
            "graphql": {"document": False, "variables": False},
            "gen_ai": {"inputs": False, "outputs": False},
            "mcp": {"inputs": False, "outputs": False},
            "database_query_data": False,
            "queues": False,
            "stack_frame_variables": False,
        },
        "before_send_log": _no_log,
    }


def _no_log(_log: Any, _hint: Hint) -> None:
    """Send no Sentry log: a log line's arguments may quote content."""
    return None


class SentryObserver(Observer):
    """The lifecycle's observer that reports each new dead letter to Sentry, ids and code only."""

    def attempt_settled(self, event: AttemptSettled) -> None:
        """Report the letter an attempt's delivery added, if any."""
        if event.letter is not None:
            report_dead_letter(event.letter)

    def turn_settled(self, event: TurnSettled) -> None:
        """Report the letter a turn's delivery added, if any."""
        if event.letter is not None:
            report_dead_letter(event.letter)

    def message_refused(self, event: MessageRefused) -> None:
        """Report a refused message's letter, if it is new."""
        if event.letter is not None:
            report_dead_letter(event.letter)

    def run_lettered(self, event: RunLettered) -> None:
        """Report the letter the sweep wrote."""
        report_dead_letter(event.letter)


def report_dead_letter(letter: Letter) -> None:
    """Report a dead letter to Sentry, tagged with its rule, reason, tenant, workspace and run."""
    if not sentry_sdk.get_client().is_active():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("dead_letter", "true")
        scope.set_tag("rule", letter.rule or "-")
        scope.set_tag("reason", str(letter.reason))
        scope.set_tag("tenant_id", letter.tenant_id or "-")
        scope.set_tag("workspace_id", letter.workspace_id or "-")
        scope.set_tag("run_id", letter.run_id or "-")
        scope.set_tag("dead_letter_id", letter.id)
        scope.fingerprint = ["actonce-dead-letter", letter.rule or "-", str(letter.reason)]
        sentry_sdk.capture_message(
            f"dead letter: {letter.reason} ({letter.rule or 'no rule'})", level="warning"
        )


def report_failure(error: BaseException, *, component: str) -> None:
    """Report an unexpected failure of `component` (such as the dispatcher's poll) to Sentry.

    The caller reports the first failure of a streak, not every retry of it; `scrub` drops the
    message of any exception that is not actonce's own, so only its type and stack leave.
    """
    if not sentry_sdk.get_client().is_active():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("component", component)
        sentry_sdk.capture_exception(error)


def scrub(event: Event, _hint: Hint) -> Event | None:
    """Drop what may carry content from an event, keeping ids, reason codes and stack frames.

    Extra data, request bodies, frame variables, contexts other than `SENTRY_CONTEXTS`,
    breadcrumbs' data, a log line's arguments (its template is kept) and the message of any
    exception that is not actonce's own (replaced by `DROPPED`) are dropped.
    """
    event.pop("extra", None)
    event.pop("request", None)
    for exception in (event.get("exception") or {}).get("values", []):
        if not str(exception.get("module") or "").startswith("actonce."):
            exception["value"] = DROPPED
        for frame in (exception.get("stacktrace") or {}).get("frames", []):
            frame.pop("vars", None)
    for thread in (event.get("threads") or {}).get("values", []):
        for frame in (thread.get("stacktrace") or {}).get("frames", []):
            frame.pop("vars", None)
    contexts = event.get("contexts")
    if contexts:
        event["contexts"] = {k: v for k, v in contexts.items() if k in SENTRY_CONTEXTS}
    logentry: Any = event.get("logentry")
    if isinstance(logentry, dict):
        logentry.pop("params", None)
        logentry.pop("formatted", None)
    breadcrumbs: Any = event.get("breadcrumbs")
    for crumb in breadcrumbs.get("values", []) if isinstance(breadcrumbs, dict) else []:
        crumb.pop("data", None)
    return event


def _plain_breadcrumb(crumb: dict[str, Any], hint: Hint) -> dict[str, Any] | None:
    """Drop a breadcrumb's data, and give a log line's breadcrumb its template, unformatted."""
    crumb.pop("data", None)
    record = (hint or {}).get("log_record")
    if isinstance(record, logging.LogRecord):
        crumb["message"] = str(record.msg)
    return crumb


DROPPED: Final = "(dropped by actonce: a library's message may quote content)"
"""What an exception's message becomes in an event, unless the exception is actonce's own."""

SENTRY_CONTEXTS: Final = frozenset(
    {"trace", "runtime", "os", "device", "app", "culture", "cloud_resource"}
)
"""The contexts sentry-sdk fills itself, about the process: kept; any other context is dropped."""
