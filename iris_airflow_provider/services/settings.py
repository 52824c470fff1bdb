"""What the services read from the cluster file: this cluster's name and region, signed identity and
who may submit, and the placement tick's settings. The cluster file (``cluster/config.py``)
extends :class:`ClusterSettings` with the backends and peers to build."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from iris_airflow_provider.backends.bundles import BundleSettings, BundleStore
from iris_airflow_provider.core.names import check_name
from iris_airflow_provider.core.serving import check_public_parent
from iris_airflow_provider.core.strict_model import StrictModel
from iris_airflow_provider.peers.identity import MAX_KEYS_PER_PEER
from iris_airflow_provider.services.serving import ServingSettings


class TrustedPeer(StrictModel):
    public_key: str | list[str] = Field(
        description="Ed25519 public key (PEM text, or the path of a PEM file), or a list of two while the peer "
        "rotates its key: the current and the next"
    )

    @field_validator("public_key")
    @classmethod
    def _one_or_two(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not 1 <= len(value) <= MAX_KEYS_PER_PEER:
            raise ValueError(
                f"give 1 or {MAX_KEYS_PER_PEER} keys (the current and, during a rotation, the next), got {len(value)}"
            )
        return value

    def public_keys(self) -> list[str]:
        return [self.public_key] if isinstance(self.public_key, str) else list(self.public_key)


class FederationSettings(StrictModel):
    """Signed peer identity, and who may hand jobs to this cluster."""

    private_key: str = Field(
        default="", description="Ed25519 private key signing this cluster's calls to its peers: PEM text or a path"
    )
    trusted_peers: dict[str, TrustedPeer] = Field(
        default_factory=dict, description="clusters allowed to call this one's peer API, by name"
    )
    allowed_submitters: list[str] = Field(
        default_factory=list, description='users whose jobs this cluster accepts: "*", "*@domain" or exact names'
    )
    public_parent: str = Field(
        default="",
        description="the parent's public origin (https://iris.example.com): serving URLs this cluster mints go "
        "through the parent's relay, /proxy/t/cluster=<this cluster>/<token>/<name>/",
    )
    service_principals: dict[str, list[str]] = Field(
        default_factory=dict,
        description="the explicit submitters DAGs may name (operator submitter=), each with the glob patterns of "
        'the DAG ids allowed to use it: {"ml-platform@example.com": ["training_*", "nightly_eval"]}',
    )

    _check_public_parent = field_validator("public_parent")(check_public_parent)


class PlacementSettings(StrictModel):
    tick_interval_seconds: float = Field(default=30, gt=0, description="fixed period of the placement DAG")
    sync_interval_seconds: float = Field(
        default=10, gt=0, description="while jobs are in flight, a tick at least this often"
    )
    max_handoffs_per_cycle: int = Field(default=8, ge=1)
    heartbeat_staleness_seconds: float = Field(default=120, gt=0)
    heartbeat_timeout_seconds: float = Field(default=10, gt=0)
    delivery_timeout_seconds: float = Field(default=180, gt=0)
    # Requeue (beyond the reference): an unpinned job a peer cannot take goes back to the queue.
    requeue_after_seconds: float = Field(
        default=300, gt=0, description="how long an unpinned handoff may keep failing to deliver before it is requeued"
    )
    requeue_avoid_seconds: float = Field(
        default=900, gt=0, description="how long a requeued job stays away from the peer it left"
    )
    max_requeues: int = Field(default=3, ge=0, description="requeues a job may spend before it fails")
    # Lifecycle (beyond the reference): jobs on a lost peer, and jobs a peer accepted but does not start.
    peer_lost_seconds: float = Field(
        default=900, gt=0, description="how long a peer may stay unreachable before its jobs are settled without it"
    )
    start_timeout_seconds: float = Field(
        default=1800,
        ge=0,
        description="how long a peer may hold a job it accepted without starting it before it is withdrawn (0: never)",
    )
    # Starvation (beyond the reference): a big job behind a stream of small ones holds a backend.
    reserve_after_seconds: float = Field(
        default=1800,
        ge=0,
        description="a gated job queued longer than this holds the backend where it would fit soonest (0: never)",
    )


class ClusterSettings(StrictModel):
    name: str
    default_region: str = Field(default="", description="added to jobs that name no region (not with regions: ['*'])")
    state_dir: Path | None = Field(default=None, description="default: $AIRFLOW_HOME/iris")
    placement: PlacementSettings = PlacementSettings()
    federation: FederationSettings = FederationSettings()
    bundles: BundleSettings = BundleSettings()
    serving: ServingSettings = ServingSettings()
    retention_days: float = Field(
        default=30,
        ge=0,
        description="finished jobs older than this leave the store with their history and output (0: keep all)",
    )

    _check_name = field_validator("name")(check_name)

    def resolved_state_dir(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        # Airflow's own answer (it expands ~ and $VARS in AIRFLOW_HOME), read when asked, not at import.
        from airflow.configuration import get_airflow_home

        return Path(get_airflow_home()) / "iris"

    def bundle_store(self) -> BundleStore:
        """Where this cluster keeps workdir bundles (``bundles.dir``, default ``<state_dir>/bundles``)."""
        return self.bundles.store(self.resolved_state_dir() / "bundles")
