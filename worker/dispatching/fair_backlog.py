"""The fair backlog: runs due and not sent yet, held by tenant and workspace, taken in turn.

Without it the dispatcher sent every due run at once into one first-in-first-out queue, and a
quiet tenant's run waited behind the whole of another tenant's burst. The backlog holds what is
due in memory and hands it out in weighted round-robin: across tenants (a tenant of weight `w`
gets `w` runs a turn, every other tenant 1), within a tenant across its workspaces, within a
workspace oldest first. A tenant newly due joins the turn at once: its first run goes out after
at most one run of each tenant already waiting.

reflexr stays the record. The backlog forgets nothing it must keep: a run it does not hold (a
tenant past `per_tenant`, or a dispatcher restarted) is still due in reflexr, and the dispatcher's
next look for due runs finds it again.
"""

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

DEFAULT_WEIGHT: Final = 1
"""The weight of a tenant `ACTONCE_FAIR_WEIGHTS` does not name."""


@dataclass
class Held:
    """A due run the backlog holds."""

    ref: WorkspaceRef
    """Its workspace."""

    run: Run
    """The run as it was last seen due."""

    since: float
    """When the dispatcher first saw it due (monotonic seconds): the start of its queue wait."""


class _Tenant:
    """One tenant's held runs: a ring of workspaces, each oldest first."""

    def __init__(self) -> None:
        self.workspaces: dict[str, dict[str, Held]] = {}
        self.ring: deque[str] = deque()
        self.size = 0

    def take(self) -> Held:
        workspace = self.ring[0]
        runs = self.workspaces[workspace]
        held = runs.pop(next(iter(runs)))
        self.size -= 1
        if runs:
            self.ring.rotate(-1)
        else:
            self.ring.popleft()
            del self.workspaces[workspace]
        return held


class FairBacklog:
    """Due runs not sent yet, taken in weighted round-robin by tenant, then workspace.

    Args:
        weights: Each named tenant's weight, 1 or more; others weigh `DEFAULT_WEIGHT`.
        per_tenant: The most runs held for one tenant; more are left to reflexr until the
            tenant's held runs go out.
    """

    def __init__(self, weights: Mapping[str, int] | None = None, *, per_tenant: int) -> None:
        self._weights = dict(weights or {})
        self._per_tenant = per_tenant
        self._tenants: dict[str, _Tenant] = {}
        self._ring: deque[str] = deque()
        self._given = 0
        """Runs the tenant at the head of the ring took in its current turn."""
        self.dropped = 0
        """Due runs not held so far, their tenant holding `per_tenant` already: reflexr keeps
        them due, and a look for due runs finds them once the tenant's held runs went."""

    def __len__(self) -> int:
        return sum(tenant.size for tenant in self._tenants.values())

    def hold(self, due: Iterable[tuple[WorkspaceRef, Run]], now: float) -> int:
        """Hold each of `due` not held already; return how many were new.

        A run held already is kept in its place, updated to the status and epoch it is due in
        now (an orphan is due again as `running`), with the time it was first seen due.
        """
        added = 0
        for ref, run in due:
            tenant = self._tenants.get(ref.tenant_id)
            if tenant is None:
                tenant = self._tenants[ref.tenant_id] = _Tenant()
                self._ring.append(ref.tenant_id)
            runs = tenant.workspaces.get(ref.workspace_id)
            if runs is not None and run.id in runs:
                runs[run.id].run = run
                continue
            if tenant.size >= self._per_tenant:
                self.dropped += 1
                continue
            if runs is None:
                runs = tenant.workspaces[ref.workspace_id] = {}
                tenant.ring.append(ref.workspace_id)
            runs[run.id] = Held(ref, run, now)
            tenant.size += 1
            added += 1
        self._drop_empty()
        return added

    def take(self, count: int, room: Mapping[str, int] | None = None) -> list[Held]:
        """Take up to `count` held runs, in turn; they are no longer held.

        Args:
            count: The most runs to take.
            room: How many more runs each tenant it names may take now (its cap on attempts in
                flight, less those in flight); a tenant with no room keeps its runs and its
                place. None: every tenant has room.
        """
        left = dict(room) if room is not None else None
        taken: list[Held] = []
        passed = 0  # tenants passed over in a row for want of room
        while len(taken) < count and self._ring and passed < len(self._ring):
            name = self._ring[0]
            tenant = self._tenants[name]
            if left is not None and left.get(name, count) <= 0:
                self._next_tenant()
                passed += 1
                continue
            passed = 0
            taken.append(tenant.take())
            if left is not None and name in left:
                left[name] -= 1
            self._given += 1
            if not tenant.size:
                del self._tenants[name]
                self._ring.popleft()
                self._given = 0
            elif self._given >= self._weights.get(name, DEFAULT_WEIGHT):
                self._next_tenant()
        return taken

    def by_tenant(self) -> Counter[str]:
        """How many runs are held for each tenant."""
        return Counter({name: tenant.size for name, tenant in self._tenants.items()})

    # ─── how ──────────────────────────────────────────────────────────────────────

    def _next_tenant(self) -> None:
        self._ring.rotate(-1)
        self._given = 0

    def _drop_empty(self) -> None:
        # A tenant all of whose runs were over `per_tenant` holds nothing: it has no turn.
        empty = [name for name, tenant in self._tenants.items() if not tenant.size]
        for name in empty:
            del self._tenants[name]
            if self._ring and self._ring[0] == name:
                self._given = 0
            self._ring.remove(name)
