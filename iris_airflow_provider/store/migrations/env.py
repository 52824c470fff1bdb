"""Alembic environment: migrations always run on a connection the store hands over."""

from __future__ import annotations

from alembic import context

from iris_airflow_provider.store.schema import VERSION_TABLE, metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through FederationStore.migrate() or `iris-federation db migrate`")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=True,  # SQLite can only alter tables by copying them
)
with context.begin_transaction():
    context.run_migrations()
