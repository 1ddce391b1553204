"""Sentry: dead letters and infrastructure failures, with ids and never content.

`init_sentry` runs in every worker process when a DSN is set, with sentry-sdk's Celery
integration; `report_dead_letter` reports a dead letter once (its caller reports only the letter
it added). Retries are control flow and are never reported. Message content, artifact data and
tool arguments never leave the process: only ids and reason codes are sent, and `scrub` drops
whatever else an event gathered (request bodies, local variables, task arguments, breadcrumbs'
data).
"""

import logging
from typing import Any

import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.types import Event, Hint

from worker.dead_letters import DeadLetter
from worker.settings import Settings

log = logging.getLogger("actonce.reporting")


def init_sentry(settings: Settings, **options: Any) -> bool:
    """Start Sentry in this process if a DSN is set; return whether it started."""
    if not settings.sentry_dsn:
        return False
    sentry_sdk.init(
        dsn=settings.sentry_dsn,
        environment=settings.sentry_environment,
        integrations=[CeleryIntegration()],
        send_default_pii=False,
        include_local_variables=False,
        max_request_body_size="never",
        before_send=scrub,
        before_breadcrumb=_plain_breadcrumb,
        **options,
    )
    return True


def report_dead_letter(letter: DeadLetter) -> None:
    """Report a dead letter to Sentry, tagged with its rule, reason, tenant, workspace and run."""
    if not sentry_sdk.get_client().is_active():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("dead_letter", "true")
        scope.set_tag("rule", letter.rule or "-")
        scope.set_tag("reason", letter.reason)
        scope.set_tag("tenant_id", letter.tenant_id or "-")
        scope.set_tag("workspace_id", letter.workspace_id or "-")
        scope.set_tag("run_id", letter.run_id or "-")
        scope.set_tag("dead_letter_id", letter.id)
        scope.fingerprint = ["actonce-dead-letter", letter.rule or "-", letter.reason]
        sentry_sdk.capture_message(
            f"dead letter: {letter.reason} ({letter.rule or 'no rule'})", level="warning"
        )


def scrub(event: Event, _hint: Hint) -> Event | None:
    """Drop what may carry content from an event: extra data, request bodies, frame variables."""
    event.pop("extra", None)
    event.pop("request", None)
    for exception in (event.get("exception") or {}).get("values", []):
        for frame in (exception.get("stacktrace") or {}).get("frames", []):
            frame.pop("vars", None)
    contexts = event.get("contexts") or {}
    contexts.pop("celery-job", None)
    return event


def _plain_breadcrumb(crumb: dict[str, Any], _hint: Hint) -> dict[str, Any] | None:
    crumb.pop("data", None)
    return crumb
