"""Dead letters keep a refused message's bytes exactly: how `raw` holds them, and their size.

`raw_encoding` says whether `raw` is the message's text or its base64 (bytes that are not UTF-8
or hold a NUL); `raw_bytes` is the message's whole length. Both are empty on older letters.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add `raw_encoding` and `raw_bytes` to `actonce_dead_letters`, unless it has them.

    A table made by `create_all` from the current columns, then adopted by 0001, has them.
    """
    existing = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("actonce_dead_letters")}
    wanted: list[sa.Column[Any]] = [
        sa.Column("raw_encoding", sa.Text, nullable=True),
        sa.Column("raw_bytes", sa.Integer, nullable=True),
    ]
    missing = [column for column in wanted if column.name not in existing]
    if missing:
        with op.batch_alter_table("actonce_dead_letters") as table:
            for column in missing:
                table.add_column(column)


def downgrade() -> None:
    """Drop them again."""
    with op.batch_alter_table("actonce_dead_letters") as table:
        table.drop_column("raw_bytes")
        table.drop_column("raw_encoding")
