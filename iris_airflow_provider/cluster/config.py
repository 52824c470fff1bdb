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

from iris_airflow_provider.federation.bands import ACCEPTED_BAND_NAMES, Band, UnknownBandError, parse_band
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


_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_K8S_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


def _k8s_name(value: str) -> str:
    if value and (len(value) > 253 or not _K8S_NAME.fullmatch(value)):
        raise ValueError(f"must be a Kubernetes object name (lowercase letters, digits, '-' and '.'), got {value!r}")
    return value


class KubernetesToleration(StrictModel):
    """A toleration the jobs carry; nodes with NoSchedule/NoExecute taints it does not cover are not counted."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class KubernetesBackendConfig(StrictModel):
    """A Kubernetes cluster (with Kueue) reached through an Airflow ``kubernetes`` connection."""

    id: str
    kind: Literal["kubernetes"]
    conn_id: str = Field(default="kubernetes_default", description="an Airflow connection of type kubernetes")
    namespace: str = Field(default="", description="where jobs run; default: the connection's, else default")
    queue_name: str = Field(
        default="", description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name); empty: no Kueue"
    )
    priority_classes: dict[str, str] = Field(
        default_factory=dict, description="band -> PriorityClass the band's jobs run with (and counted by)"
    )
    other_priority_classes: dict[str, str] = Field(
        default_factory=dict, description="PriorityClass of other workloads -> the band they count as"
    )
    variant: str | None = Field(default=None, description="every GPU node is this variant (e.g. h100)")
    variant_label: str | None = Field(default=None, description="else the node label naming a node's variant")
    variant_values: dict[str, str] = Field(
        default_factory=dict, description="variant_label value -> variant; empty: the value, lowercased"
    )
    tolerations: list[KubernetesToleration] = Field(default_factory=list)
    image: str = Field(default="", description="for jobs that name no image")
    attributes: dict[str, list[str]] = Field(default_factory=dict, description="extra advertised attributes")
    env: dict[str, str] = Field(default_factory=dict, description="defaults for every job; a job's env wins")
    files_in: Literal["configmap", "secret"] = Field(default="configmap", description="how workdir files travel")
    max_files_bytes: int = Field(default=1_000_000, ge=1, le=1_048_576, description="a ConfigMap/Secret holds 1 MiB")
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    request_timeout_seconds: float = Field(default=20, gt=0)

    _check_id = field_validator("id")(_name)
    _check_names = field_validator("namespace", "queue_name")(_k8s_name)

    @field_validator("priority_classes")
    @classmethod
    def _bands(cls, value: dict[str, str]) -> dict[str, str]:
        return {_band_name(band): _k8s_name(name) for band, name in value.items()}

    @field_validator("other_priority_classes")
    @classmethod
    def _other_bands(cls, value: dict[str, str]) -> dict[str, str]:
        return {_k8s_name(name): _band_name(band) for name, band in value.items()}

    @field_validator("variant")
    @classmethod
    def _variant(cls, value: str | None) -> str | None:
        return value.strip().lower() if value else None

    @field_validator("variant_label")
    @classmethod
    def _label_key(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not _K8S_LABEL_KEY.fullmatch(value):
            raise ValueError(f"must be a Kubernetes label key such as nvidia.com/gpu.product, got {value!r}")
        if value and info.data.get("variant"):
            raise ValueError("give variant or variant_label, not both")
        return value

    @field_validator("variant_values")
    @classmethod
    def _values(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if value and not info.data.get("variant_label"):
            raise ValueError("needs variant_label: the node label whose values these are")
        return {label: variant.strip().lower() for label, variant in value.items()}

    def band_classes(self) -> dict[Band, str]:
        return {_parsed_band(band): name for band, name in self.priority_classes.items()}

    def class_bands(self) -> dict[str, Band]:
        """Every PriorityClass this backend knows, with its band (ours win over ``other_priority_classes``)."""
        known = {name: _parsed_band(band) for name, band in self.other_priority_classes.items()}
        known.update({name: band for band, name in self.band_classes().items()})
        return known


def _band_name(raw: str) -> str:
    try:
        band = parse_band(raw, unspecified=None)
    except UnknownBandError as error:
        raise ValueError(str(error)) from None
    if band is None:
        raise ValueError(f"{raw!r} is not a band; accepted: {', '.join(ACCEPTED_BAND_NAMES)}")
    return band.name.lower()


def _parsed_band(name: str) -> Band:
    band = parse_band(name, unspecified=None)
    assert band is not None
    return band


BackendConfig = Annotated[ProcessBackendConfig | KubernetesBackendConfig, Field(discriminator="kind")]


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
    # Requeue (beyond the reference): an unpinned job a peer cannot take goes back to the queue.
    requeue_after_seconds: float = Field(
        default=300, gt=0, description="how long an unpinned handoff may keep failing to deliver before it is requeued"
    )
    requeue_avoid_seconds: float = Field(
        default=900, gt=0, description="how long a requeued job stays away from the peer it left"
    )
    max_requeues: int = Field(default=3, ge=0, description="requeues a job may spend before it fails")


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

    def backend_state_dir(self, owner: str, backend: ProcessBackendConfig) -> Path:
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
        located = [_kind_problem(_document_path(p.path, document), p.message) for p in problems]
        raise SpecError(
            [FieldProblem(f"{source}: {path}" if path else source, message) for path, message in located]
        ) from None


_BAD_TAG = re.compile(r"Input tag '.*' found using 'kind' does not match any of the expected tags: (.*)")


def _kind_problem(path: str, message: str) -> tuple[str, str]:
    """Pydantic reports a bad ``kind`` of a tagged union on the object: name the field, in our words."""
    if match := _BAD_TAG.fullmatch(message):
        return (f"{path}.kind" if path else "kind", f"must be one of: {match[1]}".replace("'", ""))
    if message.startswith("Unable to extract tag using discriminator 'kind'"):
        return (f"{path}.kind" if path else "kind", "is required")
    return path, message


def _document_path(path: str, document: Any) -> str:
    """Pydantic names a tagged union's member in the path (``peers[0].agentless.id``,
    ``backends[1].kubernetes.namespace``): drop it, so the path is the document's."""
    out = ""
    node = document
    for token in re.findall(r"\[\d+\]|[^.\[]+", path):
        if token.startswith("["):
            index = int(token[1:-1])
            node = node[index] if isinstance(node, list) and index < len(node) else None
            out += token
            continue
        if isinstance(node, dict) and token not in node and node.get("kind") == token:
            continue
        node = node.get(token) if isinstance(node, dict) else None
        out = f"{out}.{token}" if out else token
    return out


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
