"""A parent and a peer Airflow deployment, started and stopped together, for the federation e2e tests.

``test_peer_lifecycle``, ``test_high_availability`` and others run such a pair with their own
cluster files, and the modules of ``tests/e2e/shared_federation.py`` share one; this is the one
place that gives the two deployments their databases, ports and DAGs, starts them side by side and,
whatever happens, stops them and keeps their logs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.airflow_deployment import AirflowDeployment
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import free_port, migrated_store, save_logs
from tests.postgres import scratch_database

DAGS = Path(__file__).parent / "dags"


@dataclass
class DeploymentPair:
    parent: AirflowDeployment
    peer: AirflowDeployment
    parent_store: FederationStore
    peer_store: FederationStore


@contextmanager
def deployment_pair(
    root: Path,
    *,
    databases: str,
    logs: str,
    peer_port: int,
    extra_env: Mapping[str, str] | None = None,
    parent_env: Mapping[str, str] | None = None,
    parent_options: Mapping[str, Any] | None = None,
    peer_options: Mapping[str, Any] | None = None,
    parent_port: int | None = None,
) -> Iterator[DeploymentPair]:
    """Run a parent and a peer on scratch databases ``<databases>_{parent,peer}_{meta,store}``.

    Each lives in ``root/parent`` or ``root/peer`` with the cluster file ``root/parent.yaml`` or
    ``root/peer.yaml`` (written by the caller); the peer serves on ``peer_port`` (which the caller's
    proxy forwards to), the parent on ``parent_port`` or a free port. The two start side by side
    (neither needs the other to start: the parent reaches the peer only on its ticks), and the pair
    is yielded once the peer has its runner DAG and the parent the ``e2e_job`` DAG. On exit both are
    stopped, side by side too, and their logs kept as ``<logs>-parent`` and ``<logs>-peer``. ``extra_env`` goes to
    both, ``parent_env`` to the parent alone (its connections, say). ``parent_options`` and
    ``peer_options`` give more :class:`AirflowDeployment` fields (its executor, how many instances
    of each component).
    """
    env = dict(extra_env or {})
    with (
        scratch_database(f"{databases}_parent_meta") as parent_meta,
        scratch_database(f"{databases}_parent_store") as parent_store_url,
        scratch_database(f"{databases}_peer_meta") as peer_meta,
        scratch_database(f"{databases}_peer_store") as peer_store_url,
    ):
        parent = AirflowDeployment(
            home=root / "parent",
            port=parent_port or free_port(),
            metadata_url=parent_meta,
            store_url=parent_store_url,
            cluster_config=root / "parent.yaml",
            dags_folder=DAGS,
            extra_env={**env, **(parent_env or {})},
            **(parent_options or {}),
        )
        peer = AirflowDeployment(
            home=root / "peer",
            port=peer_port,
            metadata_url=peer_meta,
            store_url=peer_store_url,
            cluster_config=root / "peer.yaml",
            dags_folder=DAGS,
            extra_env=env,
            **(peer_options or {}),
        )
        parent_store = migrated_store(parent_store_url)
        peer_store = migrated_store(peer_store_url)
        try:
            both(lambda: _start(peer, RUNNER_DAG_ID), lambda: _start(parent, "e2e_job"))
            yield DeploymentPair(parent, peer, parent_store, peer_store)
        finally:
            both(parent.stop, peer.stop)
            save_logs(parent, f"{logs}-parent")
            save_logs(peer, f"{logs}-peer")
            parent_store.dispose()
            peer_store.dispose()


def _start(deployment: AirflowDeployment, dag_id: str) -> None:
    deployment.start()
    deployment.wait_for_dag(dag_id)


def both(first: Callable[[], object], second: Callable[[], object]) -> None:
    """Run the two at once (each mostly waits: on its subprocesses, PostgreSQL, the DAG parser);
    return when both have ended, raising the first one's error if either failed."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(first), pool.submit(second)]
    for future in futures:
        future.result()
