"""actonce's own tables' Alembic migrations: dead letters and turn requests.

`actonce.worker.storage.migrate.migrate_own_tables` runs them, recording the version in
`actonce_alembic_version`, apart from reflexr's, artifactr's and relayr's version tables, so all
four migrate side by side in one database. A new migration is a new file under `versions/`.
"""

from typing import Final

import sqlalchemy as sa

from actonce.tasks.turns import TURN_REQUESTS
from actonce.worker.dead_letters.store import DEAD_LETTERS_TABLE

OWN_METADATA: Final[tuple[sa.MetaData, ...]] = (DEAD_LETTERS_TABLE.metadata, TURN_REQUESTS.metadata)
"""The tables actonce's migrations make, as the code that reads and writes them declares them:
a test checks that the two agree."""

VERSION_TABLE: Final = "actonce_alembic_version"
"""Where Alembic records which of actonce's migrations a database has had."""
