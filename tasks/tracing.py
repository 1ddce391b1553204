"""The trace a delivery joins: the W3C context its message carries, and its span in that trace.

The dispatcher sends each attempt inside a span whose parent is the context the run's event was
published in (reflexr keeps the publisher's `traceparent` on the event's envelope), and puts the
send's context in the message's headers (`traceparent`, `tracestate`). Celery keeps a message's
own headers on its retries, so a retry and a redelivery join the same trace; the worker's
delivery span continues it, reflexr's run spans and artifactr's commits nest under it, and each
write is a span of its own (`tasks.outbound`).

Spans record no exception and no status text: a library's error may quote content. With no
telemetry configured, the tracer is the API's no-op one.
"""

import contextlib
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.util.types import AttributeValue

tracer = trace.get_tracer("actonce")
"""actonce's tracer: the API's, so the process's provider (or none) decides what it records."""


@contextlib.contextmanager
def continued(
    name: str, carrier: Mapping[str, object] | None, attributes: Mapping[str, AttributeValue]
) -> Iterator[trace.Span]:
    """Open the span `name` as the current one, in the trace `carrier` (a message's headers)
    names, or in a trace of its own when it names none: never under a span that happens to be
    current in the process."""
    strings = {k: v for k, v in (carrier or {}).items() if isinstance(v, str)}
    with tracer.start_as_current_span(
        name,
        context=propagate.extract(strings, context=context.Context()),
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def carried() -> dict[str, str]:
    """Return the current span's context as message headers (`traceparent`, `tracestate`);
    empty when nothing is traced."""
    carrier: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid:
        propagate.inject(carrier)
    return carrier


def in_current_context[T](coroutine: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """Return `coroutine`, run in the trace context current now wherever its loop runs it: a
    process's runtime runs coroutines in a context of its own (asyncio's `Runner` keeps one),
    where the delivery's span would not be seen."""
    captured = context.get_current()

    async def attached() -> T:
        token = context.attach(captured)
        try:
            return await coroutine
        finally:
            context.detach(token)

    return attached()
