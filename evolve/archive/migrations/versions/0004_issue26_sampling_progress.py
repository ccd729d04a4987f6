"""issue 26: the group being sampled, as the run publishes it for `evolve serve`

Revision ID: 0004_issue26
Revises: 0003_issue9
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_issue26"
down_revision = "0003_issue9"


def upgrade() -> None:
    op.create_table(
        "sampling_progress",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("run_id"),
    )


def downgrade() -> None:
    op.drop_table("sampling_progress")
