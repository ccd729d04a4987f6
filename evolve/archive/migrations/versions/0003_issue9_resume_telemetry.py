"""issue 9: incidents, per-case errors, evaluation and group telemetry, parent index

Revision ID: 0003_issue9
Revises: 0002_issue12
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_issue9"
down_revision = "0002_issue12"


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=20), nullable=False),
        sa.Column("kind", sa.String(length=100), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_incidents_run_id", "incidents", ["run_id"])
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("case_errors", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("started_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("finished_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("prompts") as batch:
        batch.add_column(sa.Column("tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("generation_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("parse_counts", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("started_at", sa.DateTime(), nullable=True))
    op.create_index("ix_programs_parent_id", "programs", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_programs_parent_id", table_name="programs")
    with op.batch_alter_table("prompts") as batch:
        for name in ("started_at", "parse_counts", "generation_s", "tokens"):
            batch.drop_column(name)
    with op.batch_alter_table("evaluations") as batch:
        for name in ("finished_at", "started_at", "case_errors"):
            batch.drop_column(name)
    op.drop_index("ix_incidents_run_id", table_name="incidents")
    op.drop_table("incidents")
