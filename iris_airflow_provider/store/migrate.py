"""Schema migration: bring the store's database to the newest Alembic revision, once, even when
several processes start at the same time (a PostgreSQL advisory lock; SQLite's write lock)."""

from __future__ import annotations

import logging
from importlib.resources import files

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from iris_airflow_provider.store.common import StoreBase
from iris_airflow_provider.store.schema import VERSION_TABLE

MIGRATION_LOCK = 0x1815_FED  # PostgreSQL advisory lock id held while migrating


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("iris_airflow_provider.store") / "migrations"))
    return config


def head_revision() -> str:
    """The newest schema revision this version of the provider knows (what ``migrate`` brings a store to)."""
    return str(ScriptDirectory.from_config(_alembic_config()).get_current_head())


def known_revisions() -> set[str]:
    """Every schema revision this version of the provider can migrate from."""
    return {script.revision for script in ScriptDirectory.from_config(_alembic_config()).walk_revisions()}


class Migrations(StoreBase):
    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to the newest revision (or to ``revision``); safe to call from several
        processes at once."""
        config = _alembic_config()
        target = head_revision() if revision == "head" else revision
        if self.revision() == target:
            return  # the common case, on every process start: no write lock taken
        alembic_log = logging.getLogger("alembic")
        level = alembic_log.level
        alembic_log.setLevel(logging.WARNING)  # keep "Running upgrade ..." out of task logs
        try:
            with self._write() as connection:
                if connection.dialect.name == "postgresql":
                    connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK})
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
        finally:
            alembic_log.setLevel(level)

    def revision(self) -> str | None:
        """The schema revision this database is at (None: not created yet)."""
        with self.engine.connect() as connection:
            current: str | None = MigrationContext.configure(
                connection, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
            return current
