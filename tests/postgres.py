"""A throwaway PostgreSQL database for tests, on the server these machines run (127.0.0.1:5432).

Outside CI a missing server skips the tests that need it, with a message saying so; with
``IRIS_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) it fails them instead, so CI never silently
skips PostgreSQL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

ADMIN_URL = os.environ.get("IRIS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REQUIRED = os.environ.get("IRIS_REQUIRE_POSTGRES") == "1"


def unavailable(reason: str) -> None:
    message = f"PostgreSQL not reachable at {make_url(ADMIN_URL).render_as_string()}: {reason}"
    if REQUIRED:
        pytest.fail(message + " (IRIS_REQUIRE_POSTGRES=1)")
    pytest.skip(message + "; start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")


@contextmanager
def scratch_database(prefix: str = "iris_test") -> Iterator[str]:
    """Create an empty database and yield its URL; drop it afterwards."""
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as error:
        admin.dispose()
        unavailable(str(error.orig).strip().splitlines()[0])
    try:
        yield make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
