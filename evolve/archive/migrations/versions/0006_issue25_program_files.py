"""issue 25: programs of several files, stored as content-addressed blobs

A program of several files keeps an empty `code` and its joined text's length in `tree_length`; its files are
rows of `program_files` (program, position, path, blob digest) and their texts rows of `program_blobs`, one per
distinct text, so a child that changes one file of fifty adds one blob. Programs of one file are untouched.

Revision ID: 0006_issue25
Revises: 0005_issue24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_issue25"
down_revision = "0005_issue24"


def upgrade() -> None:
    op.create_table(
        "program_blobs",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )
    op.create_table(
        "program_files",
        sa.Column("program_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["program_id"], ["programs.id"]),
        sa.ForeignKeyConstraint(["digest"], ["program_blobs.digest"]),
        sa.PrimaryKeyConstraint("program_id", "position"),
    )
    with op.batch_alter_table("programs") as batch:
        batch.add_column(sa.Column("tree_length", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_table("program_files")
    op.drop_table("program_blobs")
    with op.batch_alter_table("programs") as batch:
        batch.drop_column("tree_length")
