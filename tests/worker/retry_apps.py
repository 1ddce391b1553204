"""A definition whose rule may wait longer before an attempt than a retry may be delayed.

`long_waits` is the demo with `demo:work` retried after 4, then 8 minutes: its last wait (480 s)
is past the default `ACTONCE_MAX_RETRY_DELAY_S` (300 s).
"""

import dataclasses
from datetime import timedelta

from reflexr import RetryPolicy

from demo import definition as demo

LONGEST_WAIT_S = 480
"""`long_waits`' `demo:work`: the delay before its third and last attempt."""

_RETRY = RetryPolicy(
    max_attempts=3, backoff=timedelta(minutes=4), max_backoff=timedelta(minutes=10)
)

long_waits = dataclasses.replace(
    demo.app,
    rules=[
        rule.model_copy(update={"retry": _RETRY}) if rule.name == "demo:work" else rule
        for rule in demo.RULES
    ],
)
"""The demo, `demo:work` waiting up to `LONGEST_WAIT_S` between its attempts."""
