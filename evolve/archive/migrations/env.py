"""Alembic environment: migrations run on the connection the archive hands over."""

from alembic import context

from evolve.archive.models import Base

connection = context.config.attributes.get("connection")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
