"""A definition whose writes and failures carry the text they were given: the leak test's probe.

`ACTONCE_APP=bench.leaky:app`. One rule, `leaky:probe`, runs on a `ProbeRequested` whose
`marker` is a string the leak test then looks for everywhere data could leave the database. Every
run creates a thread and a notebook holding the marker, posts a notice and makes a keyed edit
with it, then ends as `ending` says:

- `succeed`: it succeeds;
- `patch_failed`: an edit under a key that does not exist, which artifactr refuses with a
  `PatchFailed` whose text quotes the notebook's data (the marker): retried, then dead-lettered
  (`attempts_exhausted`);
- `raise`: a `RuntimeError` whose message holds the marker: retried, then dead-lettered;
- `permanent`: a permanent `RunFailure` whose message holds the marker: dead-lettered at once.

The demo's definition stays as it is; this one exists to be looked for.
"""

from datetime import timedelta
from typing import Any, ClassVar, Literal

import artifactr
from pydantic import Field
from reflexr import RetryPolicy, Rule, on, run
from reflexr.core import Event
from reflexr.workspace import Action, Reaction, RunFailure

from actonce.tasks import Allowlist, Outbound
from actonce.worker.definition import Definition, Deps

type Ending = Literal["succeed", "patch_failed", "raise", "permanent"]


class ProbeEvent(Event, abstract=True, event_namespace="leaky"):
    """The probe's own events."""


class ProbeRequested(ProbeEvent, name="probe.requested"):
    """A run whose writes and failure carry `marker`, ending as `ending` says."""

    key: str
    marker: str
    ending: Ending = "succeed"


class Notebook(artifactr.Artifact, name="leaky_notebook"):
    """Keyed entries, edited directly: the marker is written into it."""

    write_policy: ClassVar[artifactr.WritePolicy] = "direct"
    entries: dict[str, str] = Field(default_factory=dict)


async def probe(reaction: Reaction[Deps]) -> dict[str, str]:
    """Write the marker in a notice, a created notebook and a keyed edit; then end as asked."""
    event = reaction.events[0].event
    assert isinstance(event, ProbeRequested)
    acting = reaction.deps.outbound.acting(reaction)
    thread = await acting.create_thread(f"probe {event.key} {event.marker}")
    notice = await acting.notice(f"notice {event.marker}", thread_id=thread)
    notebook = await acting.create(Notebook(entries={"created": f"created {event.marker}"}))
    await acting.edit(notebook, f"/entries/{event.key}", f"edited {event.marker}")
    if event.ending == "patch_failed":
        # The parent key is missing: artifactr's PatchFailed quotes the entries it looked in.
        await acting.edit(notebook, f"/entries/missing-{event.key}/deeper", "x")
    elif event.ending == "raise":
        raise RuntimeError(f"the action failed on {event.marker}")
    elif event.ending == "permanent":
        raise RunFailure(f"gave up on {event.marker}", reason="probe_refused", permanent=True)
    return {"notice": notice, "notebook": notebook}


def actions(_: Outbound) -> dict[str, Action[Any]]:
    """The probe's action by name."""
    return {"leaky-probe": probe}


app = Definition(
    rules=[
        Rule(
            name="leaky:probe",
            when=on(ProbeRequested),
            then=run("leaky-probe"),
            retry=RetryPolicy(max_attempts=2, backoff=timedelta(milliseconds=200)),
            timeout=timedelta(seconds=30),
            ordering="none",
        )
    ],
    actions=actions,
    events=[ProbeRequested],
    artifact_types=[Notebook],
    allowlists={
        "leaky:probe": Allowlist(
            direct=frozenset({"leaky_notebook"}), threads="any", create_threads=True
        )
    },
)
"""The probe's definition: `ACTONCE_APP=bench.leaky:app`."""
