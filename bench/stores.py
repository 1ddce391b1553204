"""Fresh stores for one figure: a PostgreSQL database made and dropped, or SQLite files."""

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lab.postgres import (
    POSTGRES_ADMIN_DSN,
    POSTGRES_URL_VARIABLE,
    PostgresHandle,
    PostgresUnreachable,
    fresh_postgres_database,
    lab_postgres,
)

__all__ = ["PostgresUnreachable", "fresh_stores", "owned_postgres_stores", "postgres_stores"]


@contextlib.contextmanager
def owned_postgres_stores(prefix: str) -> Iterator[tuple[dict[str, str], PostgresHandle]]:
    """Yield the store variables of a fresh database on an embedded PostgreSQL started for it,
    and the server's handle, which may `restart` it; both are gone afterwards.

    Raises:
        PostgresUnreachable: If no embedded server can be started.
    """
    with lab_postgres(None) as server, fresh_postgres_database(prefix, server) as url:
        yield {"ACTONCE_DATABASE_URL": url}, server


@contextlib.contextmanager
def postgres_stores(prefix: str) -> Iterator[tuple[dict[str, str], PostgresHandle]]:
    """Yield the store variables of a fresh database `<prefix>_<hex>`, and the handle of the
    server it is on: the one `ACTONCE_TEST_POSTGRES_SERVER` names (a test passes the suite's
    there), else 127.0.0.1:5432 when it answers, else an embedded one started for it. The
    database is dropped `WITH (FORCE)` afterwards, and an embedded server stopped.

    Raises:
        PostgresUnreachable: If the database cannot be created.
    """
    given = os.environ.get(POSTGRES_URL_VARIABLE) or POSTGRES_ADMIN_DSN
    with lab_postgres(given) as server, fresh_postgres_database(prefix, server) as url:
        yield {"ACTONCE_DATABASE_URL": url}, server


@contextlib.contextmanager
def fresh_stores(backend: str, prefix: str) -> Iterator[dict[str, str]]:
    """Yield the `ACTONCE_*` store variables of empty stores, removed afterwards.

    `postgres`: a database `<prefix>_<hex>`, dropped `WITH (FORCE)`, on the server
    `ACTONCE_TEST_POSTGRES_SERVER` names, else 127.0.0.1:5432 when it answers, else an embedded one
    started for this figure.
    `sqlite`: one file per store in a temporary directory.

    Raises:
        PostgresUnreachable: If the database cannot be created.
    """
    if backend == "postgres":
        with postgres_stores(prefix) as (stores, _):
            yield stores
    elif backend == "sqlite":
        home = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        try:
            yield {"ACTONCE_VAR_DIR": str(home)}
        finally:
            shutil.rmtree(home, ignore_errors=True)
    else:
        raise ValueError(f"backend must be postgres or sqlite, not {backend!r}")
