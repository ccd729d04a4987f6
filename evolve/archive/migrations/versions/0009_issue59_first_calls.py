"""issue 59: evaluations.first_calls, the seed's first call of each function its fixed code calls

Shown one real call of `priority` (one job's dict), the embedded model's children beat their parent 1.5 times as
often per token on job_priority. The sandbox records, while the problem's seed alone is evaluated, the first call
of each function of the editable code that the fixed code calls, with its arguments as text; this JSON list keeps
it beside the seed's evaluation. Nullable: every other program, and evaluations stored before this change.

Revision ID: 0009_issue59
Revises: 0008_issue59
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_issue59"
down_revision = "0008_issue59"


def upgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("first_calls", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_column("first_calls")
