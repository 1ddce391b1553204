"""The pool's settings: one frozen object, read from the environment once, by pydantic-settings.

Every variable starts with `ACTONCE_`, except `REDIS_URL`, honoured as the broker when
`ACTONCE_BROKER_URL` is unset, and `SENTRY_DSN`, honoured likewise; an empty variable counts as
unset. Nothing else in actonce reads `os.environ`. SQLite files under `./var/` are the embedded
default; set `ACTONCE_DATABASE_URL` to one PostgreSQL database for all stores, or each store's
URL on its own.
"""

import difflib
import logging
import os
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, Literal, Self

import redis
from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from sentry_sdk.utils import BadDsn, Dsn
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from actonce.worker.process import sentinels
from actonce.worker.process.interpreter import LoopChoice

ATTEMPTS_QUEUE: Final = "actonce.attempts"
"""The queue attempts of runs are sent to."""

TURNS_QUEUE: Final = "actonce.turns"
"""The queue turn requests are sent to, served by processes that hold the app's agent."""

QUEUES: Final = (ATTEMPTS_QUEUE, TURNS_QUEUE)
"""actonce's queues, the only ones its dispatcher and commands send to."""

UNACKED_KEY: Final = "unacked"
"""kombu's Redis hash of messages delivered to a worker and not acked yet."""

KEY_PREFIX: Final = "actonce:"
"""The prefix of every Redis key actonce writes itself (dedupe marks); queues are named above."""


OTHER_VARIABLES: Final = frozenset({"ACTONCE_TEST_POSTGRES_SERVER", "ACTONCE_TEST_POSTGRES_URL"})
"""`ACTONCE_*` variables that are not settings: the tests' PostgreSQL server and database."""

log = logging.getLogger("actonce.settings")


class SettingsError(ValueError):
    """Raised when the settings cannot be read or do not hold together; names the variable."""


LONGEST_S: Final = 7 * 24 * 3600
"""The longest any duration setting may be, a week: a longer wait is a typo, and some (a lease of
10^15 s) cannot even be a `timedelta`."""


class Settings(BaseSettings):
    """The pool's settings. Build it with `Settings.from_env()`; every field has a default."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="ignore",
        env_prefix="ACTONCE_",
        env_ignore_empty=True,
        case_sensitive=False,
        # `inf` passed every `> 0` bound, then failed at start (a lease of infinite seconds
        # cannot be a timedelta): every duration and share is a finite number.
        allow_inf_nan=False,
    )

    app: str = "demo.definition:app"
    """`ACTONCE_APP`: the application definition, as `module:attribute`."""

    broker_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("ACTONCE_BROKER_URL", "REDIS_URL", "broker_url"),
    )
    """`ACTONCE_BROKER_URL` (or `REDIS_URL`): the Redis the pool's queues live in, or the Redis
    Sentinels that watch it, `sentinel://HOST:PORT;sentinel://HOST:PORT;.../DB`, with
    `ACTONCE_BROKER_MASTER_NAME`."""

    result_backend_url: str | None = None
    """`ACTONCE_RESULT_BACKEND_URL`: where task results go; by default the broker's Redis."""

    broker_master_name: str | None = None
    """`ACTONCE_BROKER_MASTER_NAME`: the name the sentinels know the broker's master by (their
    `sentinel monitor NAME ...`); required with a `sentinel://` broker or result backend URL,
    refused without one."""

    broker_sentinel_password: SecretStr | None = None
    """`ACTONCE_BROKER_SENTINEL_PASSWORD`: the password the sentinels themselves require, if
    any; the master's own goes in the URL. Never logged or shown."""

    var_dir: Path = Path("var")
    """`ACTONCE_VAR_DIR`: where the embedded SQLite stores live when no URL is set."""

    database_url: str | None = None
    """`ACTONCE_DATABASE_URL`: one database for all four stores, such as
    `postgresql+asyncpg://actonce@db/actonce`; each store's own URL overrides it."""

    reflexr_url: str | None = None
    """`ACTONCE_REFLEXR_URL`: reflexr's store (rules, runs, leases)."""

    artifactr_url: str | None = None
    """`ACTONCE_ARTIFACTR_URL`: artifactr's store (artifacts, threads, messages)."""

    relayr_url: str | None = None
    """`ACTONCE_RELAYR_URL`: relayr's cause ledger, shared with the app's follower."""

    actonce_url: str | None = None
    """`ACTONCE_ACTONCE_URL`: actonce's own tables: dead letters and turn requests."""

    pool: Literal["prefork", "threads"] = "prefork"
    """`ACTONCE_POOL`: how an `actonce worker` runs tasks: `prefork`, one attempt at a time per
    child process; or `threads`, one process whose threads share one event loop, so that
    `concurrency` attempts wait on the stores at once."""

    concurrency: int = Field(default=2, ge=1)
    """`ACTONCE_CONCURRENCY`: prefork children per `actonce worker`, or, with `threads`,
    attempts in flight in its one process."""

    event_loop: LoopChoice = "uvloop"
    """`ACTONCE_EVENT_LOOP`: the event loop of every process's runtime: `uvloop` (asyncio's
    own where uvloop is not installed), or `asyncio`, to rule uvloop out."""

    soft_time_limit_s: int = Field(default=330, ge=1, le=LONGEST_S)
    """`ACTONCE_SOFT_TIME_LIMIT_S`: an attempt's soft limit; above every rule's timeout."""

    time_limit_s: int = Field(default=360, ge=1, le=LONGEST_S)
    """`ACTONCE_TIME_LIMIT_S`: the hard limit, after which the child is killed: an abandoned
    attempt, which reflexr retries."""

    visibility_timeout_s: int = Field(default=3600, ge=1, le=LONGEST_S)
    """`ACTONCE_VISIBILITY_TIMEOUT_S`: how long Redis waits for an ack before redelivering."""

    max_retry_delay_s: int = Field(default=300, ge=0, le=LONGEST_S)
    """`ACTONCE_MAX_RETRY_DELAY_S`: the longest retry delay rules may ask for (reflexr's default
    `max_backoff`); a definition with a rule whose policy may wait longer before an attempt is
    refused at start (`worker.definition.check_retry_delays`)."""

    lease_ttl_s: float = Field(default=30.0, gt=0, le=LONGEST_S)
    """`ACTONCE_LEASE_TTL_S`: reflexr's run lease; a killed attempt is taken over after it."""

    poll_interval_s: float = Field(default=0.1, gt=0, le=LONGEST_S)
    """`ACTONCE_POLL_INTERVAL_S`: how often the dispatcher evaluates rules and polls due runs.
    On PostgreSQL, appends wake it at once and it polls every `sweep_interval_s` between them
    (at least every second), unless this is longer."""

    linger_s: float = Field(default=0.0, ge=0, le=60)
    """`ACTONCE_LINGER_S`: how long a dispatcher woken by an append waits before it evaluates,
    so that the appends within it share one evaluation. 0 evaluates each at once, for the lowest
    latency: on a workspace whose events come one at a time, each then pays an evaluation of
    its own (a lease and a few transactions per rule). Only appends wake a dispatcher
    (PostgreSQL); on SQLite `poll_interval_s` is the same trade."""

    dispatcher_max_cpu: float = Field(default=0.5, gt=0, le=1)
    """`ACTONCE_DISPATCHER_MAX_CPU`: the share of one core the dispatcher may use; under load it
    polls less often than `poll_interval_s` to stay under it. Each event a rule hears costs an
    evaluation of its own (a lease and a few transactions per rule): too small a share holds back
    even a light stream of events spread over several workspaces."""

    sweep_interval_s: float = Field(default=0.5, gt=0, le=LONGEST_S)
    """`ACTONCE_SWEEP_INTERVAL_S`: how often the dispatcher looks for due runs when its own
    evaluation fired none: runs fired by another process, retries whose message was lost,
    attempts whose lease expired. Runs it fires itself are sent in the same poll."""

    dedupe_ttl_s: int = Field(default=60, ge=1, le=LONGEST_S)
    """`ACTONCE_DEDUPE_TTL_S`: how long the dispatcher remembers a sent (run, epoch, status)."""

    dispatch_batch: int = Field(default=500, ge=1)
    """`ACTONCE_DISPATCH_BATCH`: how many due runs one look for them reads and sends at most;
    with fair share off, the runs a poll fires are sent as they fire, however many (with it on,
    they are held in turn like the rest)."""

    fair_share: bool = True
    """`ACTONCE_FAIR_SHARE`: share the pool between tenants, and within a tenant between its
    workspaces: the dispatcher holds what is due in memory (up to `ACTONCE_DISPATCH_BATCH` runs a
    tenant; the rest stays due in reflexr) and sends it in turn, keeping the attempts queue short,
    so that one tenant's burst does not queue every other tenant's runs behind it. It costs a
    Redis round trip per top-up of the queue while runs are held, as often as the workers drain
    it. `false`: every due run is sent at once, first in, first out."""

    fair_queued_per_child: float = Field(default=5.0, gt=0, le=1000)
    """`ACTONCE_FAIR_QUEUED_PER_CHILD`: with fair share, how many attempt messages may wait in
    the queue per worker child the dispatcher sees (at least `ACTONCE_CONCURRENCY` children).
    Each one waiting is one more attempt a newly due run of another tenant waits behind; too few,
    and a child finds the queue empty between two top-ups."""

    fair_tenant_max_in_flight: int | None = Field(default=None, ge=1)
    """`ACTONCE_FAIR_TENANT_MAX_IN_FLIGHT`: with fair share, the most attempts of one tenant
    waiting in the queue or delivered and not acknowledged at once; unset, no cap but the share.
    Set, each top-up reads the attempts queue and the unacked hash whole to count them by tenant,
    and a tenant at its cap waits even while children idle."""

    fair_weights: str | None = None
    """`ACTONCE_FAIR_WEIGHTS`: with fair share, tenants' weights, `t_big=3,t_gold=2`: in each turn
    a tenant of weight 3 sends three runs where every tenant not named sends one. Unset, every
    tenant weighs 1."""

    max_message_bytes: int = Field(default=64 * 1024, ge=2048)
    """`ACTONCE_MAX_MESSAGE_BYTES`: the most bytes a message of actonce's queues may have as it
    lies in Redis (kombu's envelope, headers and base64 body); a larger one is dead-lettered as
    `oversized` before anything decodes it. An attempt's envelope holds ids only: the floor,
    2048 bytes, takes it with room to spare."""

    broker_max_retries: int = Field(default=100, ge=1)
    """`ACTONCE_BROKER_MAX_RETRIES`: how many times a worker retries a lost broker connection
    (Celery's `broker_connection_max_retries`) before it exits with status 1, for its
    supervisor to restart it. A connection the broker refuses at start (its user, password or
    database) is not retried (`worker.process.broker_access`)."""

    dispatcher_max_failed_polls: int = Field(default=15, ge=1)
    """`ACTONCE_DISPATCHER_MAX_FAILED_POLLS`: how many polls in a row may fail (the broker or a
    store away) before the dispatcher exits with status 1, for its supervisor to restart it. It
    backs off between them (1, 2, 4, 8, 16 s, then 30 s), one log line a step: 15 is about five
    minutes."""

    turn_wait_s: float = Field(default=300.0, gt=0, le=LONGEST_S)
    """`ACTONCE_TURN_WAIT_S`: how long a turn worker waits for one turn to finish."""

    turn_max_asks: int = Field(default=5, ge=1)
    """`ACTONCE_TURN_MAX_ASKS`: how many times turn workers ask for a message's turn before
    the request is dead-lettered `turn_not_taken`: each ask may run one turn, so one model bill."""

    turn_backoff_s: float = Field(default=5.0, gt=0, le=LONGEST_S)
    """`ACTONCE_TURN_BACKOFF_S`: how long a turn not taken waits before it is asked again,
    doubled after each ask (5, 10, 20, 40 s by default)."""

    turn_grace_s: float = Field(default=30.0, gt=0, le=LONGEST_S)
    """`ACTONCE_TURN_GRACE_S`: how long a turn request may stay untaken before the dispatcher
    announces it again (its announcement was lost, or its turn worker died)."""

    demo_runs: int = Field(default=40, ge=1)
    """`ACTONCE_DEMO_RUNS`: how many runs `make run` (`python -m demo`) feeds."""

    exit_when_settled: bool = False
    """`ACTONCE_EXIT_WHEN_SETTLED`: `make run` stops once its feed has settled (for scripts)."""

    demo_postgres: bool = False
    """`ACTONCE_DEMO_POSTGRES` (`make run PG=1`): `make run` keeps its stores in an embedded
    PostgreSQL under `ACTONCE_VAR_DIR` instead of SQLite files, unless a database URL is set."""

    sentry_dsn: str | None = Field(
        default=None,
        validation_alias=AliasChoices("ACTONCE_SENTRY_DSN", "SENTRY_DSN", "sentry_dsn"),
    )
    """`ACTONCE_SENTRY_DSN` (or `SENTRY_DSN`): report dead letters and infrastructure failures."""

    sentry_environment: str | None = None
    """`ACTONCE_SENTRY_ENVIRONMENT`: Sentry's environment tag."""

    prometheus_port: int | None = Field(default=None, ge=1, le=65535)
    """`ACTONCE_PROMETHEUS_PORT`: serve the process's metrics for Prometheus to scrape, where no
    OpenTelemetry Collector runs: a worker's main process on this port, its prefork child of
    index i on this port + 1 + i, and the dispatcher on this port too, unless
    `ACTONCE_DISPATCHER_PROMETHEUS_PORT` gives it one of its own (it must, on a worker's host).
    Unset: no endpoint."""

    dispatcher_prometheus_port: int | None = Field(default=None, ge=1, le=65535)
    """`ACTONCE_DISPATCHER_PROMETHEUS_PORT`: the dispatcher's metrics endpoint, when it is not
    `ACTONCE_PROMETHEUS_PORT`."""

    prometheus_host: str = "127.0.0.1"
    """`ACTONCE_PROMETHEUS_HOST`: the address the metrics endpoints listen on; `0.0.0.0` for a
    Prometheus on another host or container. The metrics carry tenant and workspace ids unless
    `ACTONCE_METRICS_DETAIL` drops them."""

    metrics_detail: Literal["workspace", "tenant", "none"] = "workspace"
    """`ACTONCE_METRICS_DETAIL`: how much tenancy the exported metrics keep, actonce's and the
    lattice libraries' alike: `workspace` (tenant and workspace), `tenant`, or `none` (neither),
    for a pool that serves many workspaces and must keep its series few. Telemetry itself is
    turned on by the standard `OTEL_*` variables."""

    @field_validator("broker_url")
    @classmethod
    def _a_redis_url(cls, value: str) -> str:
        # Checked here: redis-py refused it only when the dispatcher or a worker first used it,
        # with a traceback. The broker is Redis (the intake reads Redis's lists); the result
        # backend may be any of Celery's.
        if value and sentinels.is_sentinel(value):
            sentinels.parse(value)  # its ValueError names the part and the form
        elif value:
            try:
                redis.Redis.from_url(value).close()
            except ValueError as bad:
                raise ValueError(
                    f"not a Redis URL, redis://[USER:PASSWORD@]HOST:PORT/DB or "
                    f"{sentinels.FORM} ({bad})"
                ) from None
        return value

    @field_validator("fair_weights")
    @classmethod
    def _tenant_weights(cls, value: str | None) -> str | None:
        parse_weights(value or "")  # its ValueError names the part
        return value

    @field_validator("sentry_dsn")
    @classmethod
    def _a_sentry_dsn(cls, value: str | None) -> str | None:
        # Checked here, not when Sentry starts: every command then refuses it in one line, and
        # the line never quotes the DSN, whose key lets anyone send to the project.
        if value:
            try:
                Dsn(value)
            except BadDsn as bad:
                raise ValueError(
                    f"not a Sentry DSN, https://KEY@HOST/PROJECT ({bad}); read from "
                    "ACTONCE_SENTRY_DSN, else SENTRY_DSN"
                ) from None
        return value

    @model_validator(mode="after")
    def _sentinels_have_a_master_name(self) -> Self:
        # Checked here: kombu asked for `master_name` only when a worker first connected.
        on_sentinels = any(
            sentinels.is_sentinel(url) for url in (self.broker_url, self.results_url)
        )
        if on_sentinels and not self.broker_master_name:
            raise ValueError(
                "a sentinel:// URL needs ACTONCE_BROKER_MASTER_NAME, the name the sentinels "
                "monitor the master by"
            )
        if self.broker_master_name and not on_sentinels:
            raise ValueError(
                "ACTONCE_BROKER_MASTER_NAME is set but no URL is sentinel://: set "
                f"ACTONCE_BROKER_URL to {sentinels.FORM}, or unset the name"
            )
        return self

    @model_validator(mode="after")
    def _limits_hold_together(self) -> Self:
        if self.soft_time_limit_s >= self.time_limit_s:
            raise ValueError(
                f"ACTONCE_SOFT_TIME_LIMIT_S ({self.soft_time_limit_s}) must be below "
                f"ACTONCE_TIME_LIMIT_S ({self.time_limit_s})"
            )
        needed = self.time_limit_s + self.max_retry_delay_s
        if self.visibility_timeout_s <= needed:
            raise ValueError(
                f"ACTONCE_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s}) must exceed "
                f"ACTONCE_TIME_LIMIT_S + ACTONCE_MAX_RETRY_DELAY_S ({needed}), or Redis "
                f"redelivers attempts and retries that are still waiting; raise it"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Return the settings the environment gives, with `overrides` on top.

        Args:
            environ: The variables to read; this process's environment when None.
            overrides: Field values that win over any variable.

        Raises:
            SettingsError: Naming the variable, if a value is invalid or the limits disagree.
        """
        given = os.environ if environ is None else environ
        for warning in misspelt(given):
            if warning not in _WARNED:
                _WARNED.add(warning)
                log.warning("%s", warning)
        token = _ENVIRON.set(given)
        try:
            return cls(**overrides)
        except ValidationError as invalid:
            problems = "; ".join(f"{_variable(e['loc'])}: {e['msg']}" for e in invalid.errors())
            raise SettingsError(f"invalid settings: {problems}") from invalid
        finally:
            _ENVIRON.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Overrides, then the variables `from_env` was given: no .env file and no secrets
        # directory, so what a process runs with is what its environment says.
        return init_settings, _GivenEnvironment(settings_cls)

    def store_url(self, store: str) -> str:
        """Return the SQLAlchemy URL of `store`: `reflexr`, `artifactr`, `relayr` or `actonce`."""
        own: str | None = getattr(self, f"{store}_url")
        if own:
            return own
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.var_dir / f'{store}.db').resolve()}"

    def __repr_args__(self) -> Any:
        # A repr reaches logs, tracebacks and Sentry: URLs without their passwords, no DSN key.
        for name, value in super().__repr_args__():
            if name == "sentry_dsn" and value:
                yield name, "***"
            elif name is not None and name.endswith("_url") and isinstance(value, str):
                yield name, mask_url(value)
            else:
                yield name, value

    @property
    def lease_ttl(self) -> timedelta:
        """reflexr's run lease as a duration."""
        return timedelta(seconds=self.lease_ttl_s)

    @property
    def weights(self) -> dict[str, int]:
        """`fair_weights` by tenant."""
        return parse_weights(self.fair_weights or "")

    @property
    def results_url(self) -> str:
        """Where task results go."""
        return self.result_backend_url or self.broker_url


def parse_weights(text: str) -> dict[str, int]:
    """Return the weights `TENANT=WEIGHT,...` says, by tenant.

    Raises:
        ValueError: If a part is not `TENANT=WEIGHT` with a whole weight of 1 or more.
    """
    weights: dict[str, int] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        tenant, _, weight = part.partition("=")
        if not tenant.strip() or not weight.strip().isdigit() or int(weight) < 1:
            raise ValueError(f"{part!r} is not TENANT=WEIGHT with a weight of 1 or more, t_big=3")
        weights[tenant.strip()] = int(weight)
    return weights


def known_variables() -> frozenset[str]:
    """Return every `ACTONCE_*` variable actonce reads: the settings' and `OTHER_VARIABLES`."""
    names = {f"ACTONCE_{field.upper()}" for field in Settings.model_fields}
    return frozenset(names | OTHER_VARIABLES)


def misspelt(environ: Mapping[str, str]) -> list[str]:
    """Return a warning for each `ACTONCE_*` variable in `environ` that actonce does not read,
    naming the closest one it does; a misspelt setting would otherwise be silently ignored."""
    known = known_variables()
    warnings = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("ACTONCE_") or upper in known:
            continue
        closest = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
        hint = f"did you mean {closest[0]}?" if closest else "no setting has that name"
        warnings.append(f"{name} is not an actonce setting and is ignored: {hint}")
    return warnings


STORES: Final = ("reflexr", "artifactr", "relayr", "actonce")
"""The four stores a process opens, in the order `migrate` creates them."""


def mask_url(url: str) -> str:
    """Return `url` with its password replaced by `***`, for any message, log line or page."""
    if ";" in url:  # a sentinel URL: one URL per sentinel
        return ";".join(mask_url(part) for part in url.split(";"))
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<an unreadable URL>"


_WARNED: Final[set[str]] = set()
"""The misspelt-variable warnings this process gave already: each is given once."""

_ENVIRON: Final[ContextVar[Mapping[str, str]]] = ContextVar("actonce_environ")
"""The variables `Settings.from_env` reads, for the duration of one call."""


class _GivenEnvironment(EnvSettingsSource):
    """pydantic-settings' environment source over the mapping `from_env` was given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get(os.environ)
        return {name.lower(): value for name, value in environ.items() if value != ""}


def _variable(location: tuple[int | str, ...]) -> str:
    name = "_".join(str(part) for part in location)
    if not name:
        return "ACTONCE_SETTINGS"
    return (
        name.upper()
        if name.upper().startswith(("ACTONCE_", "REDIS_", "SENTRY_"))
        else (f"ACTONCE_{name.upper()}")
    )
