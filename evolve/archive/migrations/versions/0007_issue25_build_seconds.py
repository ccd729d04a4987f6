"""issue 25: evaluations.build_s, the seconds a program of another language spent in its [build] command

Until now the build's time reached the outcome and was dropped; it is kept beside `duration_s` (which it is part
of), so `evolve show` and `evolve inspect` can tell a slow build from a slow program. Nullable: Python programs
have no build, and evaluations stored before this change never recorded one.

Revision ID: 0007_issue25
Revises: 0006_issue25
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_issue25"
down_revision = "0006_issue25"


def upgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("build_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_column("build_s")
