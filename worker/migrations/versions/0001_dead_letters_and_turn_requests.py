"""actonce's first tables: dead letters and turn requests.

Databases made before actonce migrated with Alembic already hold these tables, made by
`create_all` from the same columns: this migration adopts a table it finds instead of failing on
it, so such a database is upgraded in place.

Revision ID: 0001
Revises:
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create `actonce_dead_letters` and `actonce_turn_requests` with their indexes."""
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "actonce_dead_letters" not in existing:
        op.create_table(
            "actonce_dead_letters",
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("tenant_id", sa.Text, nullable=True),
            sa.Column("workspace_id", sa.Text, nullable=True),
            sa.Column("run_id", sa.Text, nullable=True),
            sa.Column("rule", sa.Text, nullable=True),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("error", sa.Text, nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("task_id", sa.Text, nullable=True),
            sa.Column("queue", sa.Text, nullable=True),
            sa.Column("raw", sa.Text, nullable=True),
            sa.Column("dead_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("replays", sa.Integer, nullable=False),
        )
        op.create_index("ix_actonce_dead_letters_dead_at", "actonce_dead_letters", ["dead_at"])
    if "actonce_turn_requests" not in existing:
        op.create_table(
            "actonce_turn_requests",
            sa.Column("tenant_id", sa.String, primary_key=True),
            sa.Column("workspace_id", sa.String, primary_key=True),
            sa.Column("message_id", sa.String, primary_key=True),
            sa.Column("thread_id", sa.String, nullable=False),
            sa.Column("rule", sa.String, nullable=False),
            sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("taken_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("asks", sa.Integer, nullable=False, server_default="0"),
        )
        op.create_index(
            "actonce_turn_requests_pending", "actonce_turn_requests", ["taken_at", "requested_at"]
        )


def downgrade() -> None:
    """Drop both tables, and with them every dead letter and turn request."""
    op.drop_table("actonce_turn_requests")
    op.drop_table("actonce_dead_letters")
