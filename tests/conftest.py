"""Shared fixtures. Airflow reads its configuration at import, so the environment is set first."""

from __future__ import annotations

import os
import tempfile

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="iris-airflow-home-")
os.environ.setdefault("AIRFLOW_HOME", _AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_AIRFLOW_HOME}/airflow.db")
