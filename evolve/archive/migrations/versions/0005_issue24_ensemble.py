"""issue 24: which ensemble member and which ask made each group; each member's own policy versions

Revision ID: 0005_issue24
Revises: 0004_issue26
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_issue24"
down_revision = "0004_issue26"


def upgrade() -> None:
    with op.batch_alter_table("prompts") as batch:
        batch.add_column(sa.Column("member", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("ask", sa.String(length=40), nullable=True))
    with op.batch_alter_table("policy_versions") as batch:
        batch.add_column(sa.Column("member", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policy_versions") as batch:
        batch.drop_column("member")
    with op.batch_alter_table("prompts") as batch:
        batch.drop_column("ask")
        batch.drop_column("member")
