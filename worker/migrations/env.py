"""Alembic's environment for actonce's own migrations.

`actonce.worker.storage.migrate.migrate_own_tables` runs it on a connection it has already opened,
inside the transaction it commits, so a migration is atomic wherever the database's DDL is.
"""

from alembic import context

from actonce.worker.migrations import OWN_METADATA, VERSION_TABLE

context.configure(
    connection=context.config.attributes["connection"],
    target_metadata=list(OWN_METADATA),
    version_table=VERSION_TABLE,
)
with context.begin_transaction():
    context.run_migrations()
