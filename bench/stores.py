"""Fresh stores for one figure: a PostgreSQL database made and dropped, or SQLite files."""

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lab.postgres import PostgresUnreachable, fresh_postgres_database

__all__ = ["PostgresUnreachable", "fresh_stores"]


@contextlib.contextmanager
def fresh_stores(backend: str, prefix: str) -> Iterator[dict[str, str]]:
    """Yield the `ACTONCE_*` store variables of empty stores, removed afterwards.

    `postgres`: a database `<prefix>_<hex>` on 127.0.0.1:5432, dropped `WITH (FORCE)`.
    `sqlite`: one file per store in a temporary directory.

    Raises:
        PostgresUnreachable: If the database cannot be created.
    """
    if backend == "postgres":
        with fresh_postgres_database(prefix) as url:
            yield {"ACTONCE_DATABASE_URL": url}
    elif backend == "sqlite":
        home = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        try:
            yield {"ACTONCE_VAR_DIR": str(home)}
        finally:
            shutil.rmtree(home, ignore_errors=True)
    else:
        raise ValueError(f"backend must be postgres or sqlite, not {backend!r}")
