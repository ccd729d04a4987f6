"""evaluations.stages: each cascade stage's metrics (OpenEvolve evaluate_stage1/2/3)

Revision ID: 0002_issue12
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_issue12"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("evaluations") as batch_op:
        batch_op.add_column(sa.Column("stages", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as batch_op:
        batch_op.drop_column("stages")
