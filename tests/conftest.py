"""Shared fixtures. Airflow reads its configuration at import, so the environment is set first."""

from __future__ import annotations

import os
import tempfile

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="iris-airflow-home-")
os.environ.setdefault("AIRFLOW_HOME", _AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_AIRFLOW_HOME}/airflow.db")
# Users and a token secret for the in-process API tests (tests/ui): tokens are real JWTs signed and
# checked by Airflow's own SimpleAuthManager. A deployment started by the end-to-end tests sets its own.
os.environ.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,alice:user,bob:user,viewer:viewer")
os.environ.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", f"{_AIRFLOW_HOME}/passwords.json")
os.environ.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", "iris-tests-" + "0123456789abcdef" * 5)


import pytest  # noqa: E402  (after the environment above, which Airflow reads at import)


@pytest.fixture(autouse=True)
def _fresh_store_url_cache():
    """Tests point the store connection at a new database each time: forget cached lookups."""
    from iris_airflow_provider.hooks import federation_store

    federation_store._async_urls.clear()
    yield
    federation_store._async_urls.clear()


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory):
    """The real Kubernetes control plane (``devtools/kube_cluster.py``: etcd, kube-apiserver,
    controller manager, scheduler, Kueue, KWOK), started once for the session on first use.

    Its binaries are built by ``scripts/kube-binaries.sh`` (the first build takes a while); without
    them the tests that need it skip, saying so, unless ``IRIS_REQUIRE_KUBERNETES=1``, which fails them.
    """
    from devtools.kube_cluster import KubeCluster, find_binaries

    bin_dir = find_binaries()
    if bin_dir is None:
        message = "the Kubernetes control plane binaries are not built; run: bash scripts/kube-binaries.sh"
        if os.environ.get("IRIS_REQUIRE_KUBERNETES") == "1":
            pytest.fail(message + " (IRIS_REQUIRE_KUBERNETES=1)")
        pytest.skip(message)
    with KubeCluster(tmp_path_factory.mktemp("kube"), bin_dir) as kube:
        yield kube


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory):
    """fake-gcs-server (``devtools/gcs_emulator.py``), a real Google Cloud Storage emulator, started
    once for the session on first use, with a bucket ``iris-bundles``.

    Its binary is built by ``scripts/gcs-emulator.sh``; without it the tests that need it skip,
    saying so, unless ``IRIS_REQUIRE_GCS=1``, which fails them.
    """
    from devtools.gcs_emulator import GcsEmulator, find_server

    server = find_server()
    if server is None:
        message = "the GCS emulator is not built; run: bash scripts/gcs-emulator.sh"
        if os.environ.get("IRIS_REQUIRE_GCS") == "1":
            pytest.fail(message + " (IRIS_REQUIRE_GCS=1)")
        pytest.skip(message)
    with GcsEmulator(tmp_path_factory.mktemp("gcs"), server) as gcs:
        gcs.create_bucket("iris-bundles")
        yield gcs
