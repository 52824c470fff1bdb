"""The newest schema revision, read from the migration scripts (not restated by hand)."""

from __future__ import annotations

from importlib.resources import files

from alembic.config import Config
from alembic.script import ScriptDirectory

_config = Config()
_config.set_main_option("script_location", str(files("iris_airflow_provider.store") / "migrations"))
HEAD = ScriptDirectory.from_config(_config).get_current_head()
