"""Turn requests keep when they were last asked for and when they are next due.

`asked_at` is the time of the last counted ask, from which the back-off before the next one
runs; `due_at` is when the request may next be looked at, so the dispatcher does not announce a
request again while its turn task waits out a back-off. Both are empty on older requests, which
are then due at once, as before.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add `asked_at` and `due_at` to `actonce_turn_requests`, unless it has them.

    A table made by `create_all` from the current columns, then adopted by 0001, has them.
    """
    existing = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("actonce_turn_requests")}
    wanted: list[sa.Column[Any]] = [
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
    ]
    missing = [column for column in wanted if column.name not in existing]
    if missing:
        with op.batch_alter_table("actonce_turn_requests") as table:
            for column in missing:
                table.add_column(column)


def downgrade() -> None:
    """Drop them again."""
    with op.batch_alter_table("actonce_turn_requests") as table:
        table.drop_column("due_at")
        table.drop_column("asked_at")
