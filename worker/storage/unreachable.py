"""Why a store's database cannot be used, in one line an operator can act on, password masked.

A wrong database URL fails deep inside SQLAlchemy or asyncpg with a long traceback whose last
line rarely names the URL; `describe` turns the failure into one line: the database cannot be
reached, does not exist, refuses the login, or the URL is not one actonce supports. Only a store
whose tables are missing is told to run `actonce migrate` (`runtime.StoresNotMigrated`).
"""

from typing import Final

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from actonce.worker.settings import mask_url

SUPPORTED_DRIVERS: Final = ("sqlite+aiosqlite", "postgresql+asyncpg")
"""The SQLAlchemy drivers a store URL may name."""

HOW_TO_WRITE_A_URL: Final = (
    "use postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE or sqlite+aiosqlite:///PATH"
)
"""What an error about an unsupported URL tells the reader to do."""


class StoreUnreachable(RuntimeError):
    """Raised at start when a store's database cannot be used; the message is one line."""


def unsupported(url: str) -> str | None:
    """Return why `url` is not a store URL actonce supports, or None when it is."""
    try:
        driver = make_url(url).drivername
    except ArgumentError:
        return f"{mask_url(url)} is not a database URL: {HOW_TO_WRITE_A_URL}"
    if driver in SUPPORTED_DRIVERS:
        return None
    return f"{mask_url(url)} names the driver {driver!r}, which actonce does not support: " + (
        HOW_TO_WRITE_A_URL
    )


def describe(store: str, url: str, error: BaseException) -> str:
    """Return one line saying why `store`'s database at `url` failed with `error`.

    The URL's password is masked; the error's own text is kept short and never repeats the URL.
    """
    line = _line(store, url, error)
    password = _password(url)
    return line.replace(password, "***") if password else line


# ─── how ──────────────────────────────────────────────────────────────────────


def _line(store: str, url: str, error: BaseException) -> str:
    where = mask_url(url)
    problem = unsupported(url)
    if problem is not None:
        return f"the {store} store: {problem}"
    names = {type(cause).__name__ for cause in _chain(error)}
    if "InvalidCatalogNameError" in names:
        database = make_url(url).database
        return (
            f"the {store} store's database {database!r} does not exist at {where}: create it "
            "(`createdb`), or fix ACTONCE_DATABASE_URL; then run `actonce migrate`"
        )
    if names & {"InvalidPasswordError", "InvalidAuthorizationSpecificationError"}:
        return f"the {store} store's database at {where} refuses the login: check user and password"
    if "UndefinedTableError" in names or "no such table" in _last(error):
        return f"the {store} store at {where} has no tables: run `actonce migrate`"
    if names & {"OperationalError"} and url.startswith("sqlite"):
        return f"the {store} store's SQLite file at {where} cannot be opened: {_last(error)}"
    if names & {
        "ConnectionRefusedError",
        "TimeoutError",
        "gaierror",
        "OSError",
        "CannotConnectNowError",
        "ConnectionDoesNotExistError",
    }:
        return f"cannot reach the {store} store's database at {where}: {_last(error)}"
    return f"the {store} store's database at {where} failed: {_last(error)}"


def _password(url: str) -> str | None:
    try:
        password = make_url(url).password
        return str(password) if password else None
    except ArgumentError:
        return None


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _last(error: BaseException) -> str:
    """The innermost cause's type and first line, which names what failed without a URL."""
    innermost = _chain(error)[-1]
    text = str(innermost).strip().splitlines()
    return f"{type(innermost).__name__}: {text[0]}" if text else type(innermost).__name__
