"""The cluster configuration file: this cluster's name, its local backends and its peers.

YAML (or JSON), validated before anything uses it; an error names the file, the path of every bad
field and what is accepted. Example::

    name: marin
    placement:
      tick_interval_seconds: 30
      max_handoffs_per_cycle: 8
    backends:
      - id: cpu
        kind: process
        max_running_jobs: 4
    peers:
      - id: cw-h100
        kind: agentless
        backends:
          - {id: default, kind: process, devices: {h100: 8}}

Where the file lives: ``[iris_federation] cluster_config`` (``AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG``).
Without one, the cluster is ``local`` with one CPU process backend and no peers.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator

from iris_airflow_provider.federation.errors import FieldProblem, SpecError
from iris_airflow_provider.federation.model import StrictModel

_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?")


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"must be 1-64 lowercase letters, digits, '.', '_' or '-', got {value!r}")
    return value


class ProcessBackendConfig(StrictModel):
    id: str
    kind: Literal["process"]
    devices: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="device slots per variant, e.g. {h100: 8}"
    )
    device_type: Literal["gpu", "tpu", "cpu"] | None = Field(default=None, description="default: gpu with devices")
    attributes: dict[str, list[str]] = Field(default_factory=dict, description="extra advertised attributes")
    max_running_jobs: int | None = Field(default=None, ge=1)
    state_dir: Path | None = Field(default=None, description="default: <state_dir>/<cluster>/<backend id>")
    env: dict[str, str] = Field(default_factory=dict, description="defaults for every job; a job's env wins")

    _check_id = field_validator("id")(_name)

    @field_validator("devices")
    @classmethod
    def _lower(cls, value: dict[str, int]) -> dict[str, int]:
        return {variant.strip().lower(): slots for variant, slots in value.items()}


BackendConfig = ProcessBackendConfig


class AgentlessPeerConfig(StrictModel):
    """A peer the parent drives directly, with no agent running there."""

    id: str
    kind: Literal["agentless"]
    backends: list[BackendConfig] = Field(min_length=1)

    _check_id = field_validator("id")(_name)

    @field_validator("backends")
    @classmethod
    def _unique(cls, value: list[BackendConfig]) -> list[BackendConfig]:
        _no_duplicates("id", [b.id for b in value])
        return value


class AirflowPeerConfig(StrictModel):
    """Another Airflow deployment running this provider, reached over its peer API."""

    id: str
    kind: Literal["airflow"]
    url: str = Field(description="the peer's api-server, e.g. https://airflow.cw-east.example.com")
    timeout_seconds: float = Field(default=10, gt=0)

    _check_id = field_validator("id")(_name)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")


PeerConfig = Annotated[AgentlessPeerConfig | AirflowPeerConfig, Field(discriminator="kind")]


class TrustedPeer(StrictModel):
    public_key: str = Field(description="Ed25519 public key: PEM text, or the path of a PEM file")


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


class PlacementSettings(StrictModel):
    tick_interval_seconds: float = Field(default=30, gt=0, description="fixed period of the placement DAG")
    sync_interval_seconds: float = Field(
        default=10, gt=0, description="while jobs are in flight, a tick at least this often"
    )
    max_handoffs_per_cycle: int = Field(default=8, ge=1)
    heartbeat_staleness_seconds: float = Field(default=120, gt=0)
    heartbeat_timeout_seconds: float = Field(default=10, gt=0)
    delivery_timeout_seconds: float = Field(default=180, gt=0)


class ClusterConfig(StrictModel):
    name: str
    default_region: str = Field(default="", description="added to jobs that name no region (not with regions: ['*'])")
    state_dir: Path | None = Field(default=None, description="default: $AIRFLOW_HOME/iris")
    placement: PlacementSettings = PlacementSettings()
    federation: FederationSettings = FederationSettings()
    backends: list[BackendConfig] = Field(default_factory=list)
    peers: list[PeerConfig] = Field(default_factory=list)

    _check_name = field_validator("name")(_name)

    @field_validator("backends")
    @classmethod
    def _unique_backends(cls, value: list[BackendConfig]) -> list[BackendConfig]:
        _no_duplicates("id", [b.id for b in value])
        return value

    @field_validator("peers")
    @classmethod
    def _unique_peers(cls, value: list[PeerConfig], info: ValidationInfo) -> list[PeerConfig]:
        _no_duplicates("id", [p.id for p in value])
        # A peer named like this cluster would share its state directories (<state_dir>/<name>/...).
        if info.data.get("name") in {p.id for p in value}:
            raise ValueError(f"a peer cannot be named {info.data['name']!r}: that is this cluster's own name")
        return value

    def resolved_state_dir(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "iris"

    def backend_state_dir(self, owner: str, backend: BackendConfig) -> Path:
        return backend.state_dir or self.resolved_state_dir() / owner / backend.id


def _no_duplicates(field: str, values: list[str]) -> None:
    repeated = sorted(v for v, n in Counter(values).items() if n > 1)
    if repeated:
        raise ValueError(f"{field} must be unique; repeated: {', '.join(repeated)}")


DEFAULT_CONFIG = {"name": "local", "backends": [{"id": "local", "kind": "process", "max_running_jobs": 4}]}


def parse_cluster_config(document: Any, *, source: str = "cluster configuration") -> ClusterConfig:
    try:
        return ClusterConfig.model_validate(document)
    except ValidationError as error:
        problems = SpecError.from_validation_error(error).problems
        located = [(_document_path(p.path, document), p.message) for p in problems]
        raise SpecError(
            [FieldProblem(f"{source}: {path}" if path else source, message) for path, message in located]
        ) from None


def _document_path(path: str, document: Any) -> str:
    """Pydantic names a tagged union's member in the path (``peers[0].agentless.id``): drop it, so
    the path is the document's (``peers[0].id``)."""
    match = re.match(r"peers\[(\d+)\]\.([^.\[]+)", path)
    peers = document.get("peers") if isinstance(document, dict) else None
    if match is None or not isinstance(peers, list) or int(match[1]) >= len(peers):
        return path
    peer = peers[int(match[1])]
    if isinstance(peer, dict) and peer.get("kind") == match[2]:
        return f"peers[{match[1]}]" + path[match.end() :]
    return path


def load_cluster_config(path: str | Path | None) -> ClusterConfig:
    """Read and validate the file at ``path`` (YAML or JSON); ``None``: the built-in single-node default."""
    if path is None or str(path) == "":
        return parse_cluster_config(DEFAULT_CONFIG, source="default cluster configuration")
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError.single(str(path), f"cannot read the cluster configuration: {error.strerror}") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise SpecError.single(
            str(path), f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}"
        ) from None
    return parse_cluster_config(document, source=str(path))
