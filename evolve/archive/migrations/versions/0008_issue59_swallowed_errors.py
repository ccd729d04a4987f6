"""issue 59: evaluations.swallowed, the exceptions the candidate's code raised into the evaluator's

OpenEvolve-style evaluators wrap the candidate in `try: ... except Exception: score = 0`, so a child that raised
`NameError` was stored with no error at all. The sandbox now counts what escaped the candidate's code, and this
JSON list keeps it beside the evaluation: [{type, message, file, line, count}], the most frequent first, at most
eight. Nullable: nothing escaped, and evaluations stored before this change never recorded it.

Revision ID: 0008_issue59
Revises: 0007_issue25
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_issue59"
down_revision = "0007_issue25"


def upgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("swallowed", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_column("swallowed")
