"""One parent (``marin``) and peer (``cw-east``) pair, shared by the e2e modules that only submit jobs to it.

Starting a pair of real deployments takes a minute or more on a busy machine, and the modules
``test_peer_federation``, ``test_peer_bundles`` and ``test_job_trees`` need the same thing of it,
so they run against one: the ``federation`` fixture (``tests/e2e/conftest.py``) starts it the first
time a test asks for it and stops it after the last test in a row that uses it (the conftest runs
those modules one after another). Whatever the order, a test gets a running pair: one started
again if need be. Tests on it must not assume they are alone there: each uses job ids of its own
(or none, and so an id of its own) and looks only at its own jobs. A test that takes a deployment
down for good (``test_peer_lifecycle``) runs its own pair; one that restarts a component brings it
back before it ends.

The pair: marin reaches cw-east's API through a loopback proxy that can lose or hold one answer on
purpose, with its signing key in an Airflow connection (the environment secrets backend: no key
file in marin's configuration); calls are signed with real Ed25519 keys; cw-east trusts marin's
key (and a ``rogue`` one, which owns no jobs) and admits submitters ``*@example.com`` and ``alice``.
Its ``one-at-a-time`` backend queues work at its ``max_running_jobs`` (only a100 jobs fit it;
other jobs go to ``default``, the lowest backend id, under the placement's tie-break).

A module joins by asking for ``federation`` instead of starting its own pair, once its jobs fit
this one. ``test_serving`` would need cw-east to mint serving URLs through marin: ``serving:
{token_secret: ...}`` and ``federation.public_parent`` (marin's URL: pick ``parent_port`` before
writing ``peer.yaml`` and pass it to ``deployment_pair``), and its relay to pass the proxy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.airflow_deployment import AirflowDeployment
from devtools.fault_proxy import FaultProxy
from iris_airflow_provider.peers.identity import generate_keypair
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import free_port
from tests.e2e.deployments import deployment_pair

FIXTURE = "federation"  # the fixture's name: what marks a test as using the shared pair
E2E_TESTS = Path(__file__).resolve().parent


@dataclass
class Federation:
    parent: AirflowDeployment
    peer: AirflowDeployment
    parent_store: FederationStore
    peer_store: FederationStore
    proxy: FaultProxy
    keys: dict[str, tuple[str, str]]  # cluster -> (private PEM, public PEM)


@contextmanager
def running_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    root = tmp_path_factory.mktemp("federation")
    keys = {name: generate_keypair() for name in ("marin", "cw-east", "rogue")}
    for name, (private, public) in keys.items():
        (root / f"{name}.key").write_text(private)
        (root / f"{name}.pub").write_text(public)
    peer_port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{peer_port}").start()
    (root / "parent.yaml").write_text(
        """
name: marin
placement: {sync_interval_seconds: 2}
backends: [{id: cpu, kind: process, max_running_jobs: 4}]
peers: [{id: cw-east, kind: airflow, conn_id: cw_east, allow_insecure_http: true}]
"""
    )
    cw_east = {"conn_type": "irisfederationpeer", "host": proxy.url, "password": keys["marin"][0]}
    (root / "peer.yaml").write_text(
        f"""
name: cw-east
placement: {{sync_interval_seconds: 2}}
federation:
  private_key: {root / "cw-east.key"}
  trusted_peers:
    marin: {{public_key: {root / "marin.pub"}}}
    rogue: {{public_key: {root / "rogue.pub"}}}
  allowed_submitters: ["*@example.com", "alice"]
backends:
  - {{id: default, kind: process, devices: {{h100: 8}}}}
  # Runs one job at a time and queues the rest, advertising the devices they will take as free.
  - {{id: one-at-a-time, kind: process, devices: {{a100: 8}}, max_running_jobs: 1}}
"""
    )
    try:
        with deployment_pair(
            root,
            databases="iris_fed",
            logs="federation",
            peer_port=peer_port,
            parent_env={"AIRFLOW_CONN_CW_EAST": json.dumps(cw_east)},
        ) as running:
            yield Federation(running.parent, running.peer, running.parent_store, running.peer_store, proxy, keys)
    finally:
        proxy.stop()


class SharedFederation:
    """The pair, started on first use and stopped on :meth:`close` (then started again if asked for)."""

    def __init__(self) -> None:
        self._running: ExitStack | None = None
        self._federation: Federation | None = None

    def get(self, tmp_path_factory: pytest.TempPathFactory) -> Federation:
        if self._federation is None:
            with ExitStack() as stack:
                federation = stack.enter_context(running_federation(tmp_path_factory))
                self._running, self._federation = stack.pop_all(), federation
        assert self._federation is not None
        return self._federation

    def close(self) -> None:
        running, self._running, self._federation = self._running, None, None
        if running is not None:
            running.close()


SHARED = SharedFederation()


def uses_shared_pair(item: pytest.Item) -> bool:
    """Whether ``item`` asks for the pair: the ``federation`` fixture of the e2e tests (other suites
    have fixtures of that name of their own)."""
    return FIXTURE in getattr(item, "fixturenames", ()) and Path(item.path).is_relative_to(E2E_TESTS)


def group_shared_modules(items: list[pytest.Item]) -> None:
    """Move the modules with a test on the shared pair (whole modules: their own module fixtures
    are set up once) to run one after another, where the first of them would have run."""
    shared_modules = {item.module for item in items if uses_shared_pair(item)}  # type: ignore[attr-defined]
    if not shared_modules:
        return
    shared = [item for item in items if getattr(item, "module", None) in shared_modules]
    first = items.index(shared[0])
    rest = [item for item in items if getattr(item, "module", None) not in shared_modules]
    items[:] = rest[:first] + shared + rest[first:]
