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
      - id: cw-east           # an Airflow peer: its cluster name, and its api-server over https
        kind: airflow
        url: https://airflow.cw-east.example.com

Where it comes from (one of): a file, ``[iris_federation] cluster_config``; the document itself,
``cluster_config_json``; or an Airflow Variable holding it, ``cluster_config_variable`` (for
managed Airflow, where shipping a file to every component is awkward). Without any, the cluster is
``local`` with one CPU process backend and no peers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from iris_airflow_provider.backends.kubernetes.config import GKECluster, KubernetesBackendConfig, KubernetesToleration
from iris_airflow_provider.backends.process.config import ProcessBackendConfig
from iris_airflow_provider.core.errors import FieldProblem, SpecError
from iris_airflow_provider.core.names import check_name, unique_by
from iris_airflow_provider.core.strict_model import StrictModel
from iris_airflow_provider.services.settings import (
    ClusterSettings,
    FederationSettings,
    PlacementSettings,
    TrustedPeer,
)

__all__ = [
    "AgentlessPeerConfig",
    "AirflowPeerConfig",
    "BackendConfig",
    "ClusterConfig",
    "FederationSettings",
    "GKECluster",
    "KubernetesBackendConfig",
    "KubernetesToleration",
    "PeerConfig",
    "PlacementSettings",
    "ProcessBackendConfig",
    "TrustedPeer",
    "check_peer_url",
    "load_cluster_config",
    "parse_cluster_config",
    "parse_cluster_config_text",
]

BackendConfig = Annotated[ProcessBackendConfig | KubernetesBackendConfig, Field(discriminator="kind")]


class AgentlessPeerConfig(StrictModel):
    """A peer the parent drives directly, with no agent running there."""

    id: str
    kind: Literal["agentless"]
    backends: list[BackendConfig] = Field(min_length=1)
    allowed_submitters: list[str] = Field(
        default_factory=list,
        description='whose jobs may be handed to this peer: "*", "*@domain" or exact names (the admission an '
        "Airflow peer applies to itself, checked here by the parent before the handoff); none by default",
    )

    _check_id = field_validator("id")(check_name)

    _unique_backends = field_validator("backends")(unique_by("id"))


class AirflowPeerConfig(StrictModel):
    """Another Airflow deployment running this provider, reached over its peer API: at ``url``, or
    through an Airflow connection (``conn_id``, type ``irisfederationpeer``: its host is the URL and
    its password, from any secrets backend, the private key this cluster signs its calls with)."""

    id: str = Field(description="the peer's own cluster name: its tokens are signed for that name alone")
    kind: Literal["airflow"]
    # Declared before ``url``, whose check reads it.
    allow_insecure_http: bool = Field(
        default=False, description="accept an http:// url (tests and local demos only: tokens and jobs travel in clear)"
    )
    url: str = Field(default="", description="the peer's api-server, e.g. https://airflow.cw-east.example.com")
    conn_id: str = Field(default="", description="or an Airflow connection of type irisfederationpeer naming it")
    timeout_seconds: float = Field(default=10, gt=0)

    _check_id = field_validator("id")(check_name)

    @field_validator("url")
    @classmethod
    def _https(cls, value: str, info: ValidationInfo) -> str:
        return check_peer_url(value, info.data.get("allow_insecure_http", False)) if value else value

    @model_validator(mode="after")
    def _one_address(self) -> AirflowPeerConfig:
        if bool(self.url) == bool(self.conn_id):
            raise ValueError(
                "give the peer's url, or conn_id (an Airflow connection of type irisfederationpeer), "
                + ("not both" if self.url else "one of them")
            )
        return self


def check_peer_url(value: str, allow_insecure_http: bool) -> str:
    """A peer's URL, if https (or http where the peer allows it); else the reason it is refused."""
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an https:// URL, got {value!r}")
    if value.startswith("http://") and not allow_insecure_http:
        raise ValueError(
            f"{value!r} is plain http://, which sends peer tokens and jobs in the clear: use https://, "
            "or set allow_insecure_http: true on this peer (tests and local demos only)"
        )
    return value.rstrip("/")


PeerConfig = Annotated[AgentlessPeerConfig | AirflowPeerConfig, Field(discriminator="kind")]


class ClusterConfig(ClusterSettings):
    """The whole cluster file: the services' settings, and the backends and peers to build."""

    backends: list[BackendConfig] = Field(default_factory=list)
    peers: list[PeerConfig] = Field(default_factory=list)

    _unique_backends = field_validator("backends")(unique_by("id"))

    @field_validator("peers")
    @classmethod
    def _unique_peers(cls, value: list[PeerConfig], info: ValidationInfo) -> list[PeerConfig]:
        unique_by("id")(value)
        # A peer named like this cluster would share its state directories (<state_dir>/<name>/...).
        if info.data.get("name") in {p.id for p in value}:
            raise ValueError(f"a peer cannot be named {info.data['name']!r}: that is this cluster's own name")
        return value

    def backend_state_dir(self, owner: str, backend: ProcessBackendConfig) -> Path:
        return backend.state_dir or self.resolved_state_dir() / owner / backend.id


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


def parse_cluster_config_text(text: str, *, source: str) -> ClusterConfig:
    """A document given as text (YAML, or JSON, which YAML reads too), e.g. from a Variable."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError.single(source, f"not valid YAML or JSON: {error}") from None
    if not isinstance(document, dict):
        raise SpecError.single(source, f"must be a mapping (name, backends, peers ...), got {type(document).__name__}")
    return parse_cluster_config(document, source=source)


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
