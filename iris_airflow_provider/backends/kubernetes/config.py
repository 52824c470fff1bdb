"""A Kubernetes backend's entry in the cluster file: connection (a ``kubernetes`` connection, or a
GKE cluster named by ``gke:``), namespace, Kueue queue, priority classes per band, how GPU variants
are read off nodes, tolerations, job defaults, the pod template (the peer's own additions to every
pod: ``pod_template.py``) and the bundle store (``gcs_bundles.py``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from iris_airflow_provider.backends.kubernetes.gcs_bundles import DEFAULT_FETCH_IMAGE, check_bundle_store
from iris_airflow_provider.backends.kubernetes.manifests import SERVING_PORT_BASE
from iris_airflow_provider.backends.kubernetes.pod_template import PodTemplateError, checked_pod_template
from iris_airflow_provider.core.bands import ACCEPTED_BAND_NAMES, Band, UnknownBandError, parse_band
from iris_airflow_provider.core.names import check_name, matching
from iris_airflow_provider.core.serving import MAX_PORTS
from iris_airflow_provider.core.strict_model import StrictModel

_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_K8S_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


def _k8s_name(value: str) -> str:
    if value and (len(value) > 253 or not _K8S_NAME.fullmatch(value)):
        raise ValueError(f"must be a Kubernetes object name (lowercase letters, digits, '-' and '.'), got {value!r}")
    return value


# Google's rules for the names a GKE cluster is found by (the Container API refuses anything else).
_GCP_PROJECT = re.compile(r"([a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")  # optional "domain:"
_GCP_LOCATION = re.compile(r"[a-z]+-[a-z]+[0-9]+(-[a-z])?")  # a region (us-central1) or a zone (us-central1-a)
_GKE_CLUSTER = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
_SERVICE_ACCOUNT = re.compile(r"[^@\s,]+@[^@\s,]+")
_API_ENDPOINT = re.compile(r"https?://[^/\s]+")


class GKECluster(StrictModel):
    """A GKE cluster reached through a Google Cloud connection: its endpoint and CA come from the
    Container API and its tokens from the connection's credentials, through the google provider's
    GKE hooks (``gke.py``); no kubeconfig."""

    gcp_conn_id: str = Field(
        default="google_cloud_default", description="an Airflow connection of type google_cloud_platform"
    )
    project_id: str | None = Field(default=None, description="the cluster's project; default: the connection's")
    location: str = Field(description="the cluster's region (us-central1) or zone (us-central1-a)")
    cluster_name: str
    impersonation_chain: list[str] = Field(
        default_factory=list, description="service accounts to impersonate, in order (the last one acts)"
    )
    use_dns_endpoint: bool = Field(default=False, description="reach the control plane by its DNS endpoint")
    use_internal_ip: bool = Field(default=False, description="reach the control plane by its private endpoint")
    api_endpoint: str | None = Field(
        default=None,
        description="the Container API (REST) when not Google's: a Private Service Connect endpoint, a stand-in",
    )

    @field_validator("gcp_conn_id")
    @classmethod
    def _conn_id(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name an Airflow connection of type google_cloud_platform")
        return value

    _project = field_validator("project_id")(
        matching(
            _GCP_PROJECT,
            "a Google Cloud project id (6 to 30 lowercase letters, digits and hyphens, starting with a letter)",
        )
    )
    _location = field_validator("location")(
        matching(_GCP_LOCATION, "a Google Cloud region (us-central1) or zone (us-central1-a)")
    )
    _cluster = field_validator("cluster_name")(
        matching(
            _GKE_CLUSTER, "a GKE cluster name (up to 40 lowercase letters, digits and hyphens, starting with a letter)"
        )
    )

    @field_validator("impersonation_chain", mode="before")
    @classmethod
    def _chain(cls, value: Any) -> Any:
        # As the google provider takes it: one account, a comma-separated string, or a list.
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if isinstance(value, list):
            for account in value:
                if not isinstance(account, str) or not _SERVICE_ACCOUNT.fullmatch(account):
                    raise ValueError(
                        f"must be service account emails (name@project.iam.gserviceaccount.com), got {account!r}"
                    )
        return value

    @field_validator("use_internal_ip")
    @classmethod
    def _one_endpoint(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("use_dns_endpoint"):
            raise ValueError("give use_dns_endpoint or use_internal_ip, not both")
        return value

    @field_validator("api_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not _API_ENDPOINT.fullmatch(value.rstrip("/")):
            raise ValueError(f"must be an http(s)://host[:port] URL, got {value!r}")
        return value.rstrip("/") if value else None


class KubernetesToleration(StrictModel):
    """A toleration the jobs carry; nodes with NoSchedule/NoExecute taints it does not cover are not counted."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class KubernetesBackendConfig(StrictModel):
    """A Kubernetes cluster (with Kueue) reached through an Airflow ``kubernetes`` connection, or a
    GKE cluster named by ``gke`` (one of the two)."""

    id: str
    kind: Literal["kubernetes"]
    conn_id: str = Field(default="kubernetes_default", description="an Airflow connection of type kubernetes")
    gke: GKECluster | None = Field(default=None, description="else a GKE cluster, through a Google Cloud connection")
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
    coordinator_port: int = Field(
        default=29500, ge=1, le=65535, description="where replica 0 listens for the others (MASTER_PORT)"
    )
    serving_port_base: int = Field(
        default=SERVING_PORT_BASE,
        ge=1024,
        le=65535 - MAX_PORTS,
        description="the containerPort of a job's first named port; its others follow, one each",
    )
    request_timeout_seconds: float = Field(default=20, gt=0)
    pod_template: dict[str, Any] | None = Field(
        default=None, description="a Pod manifest merged into every job's pods (the peer's; a job cannot set it)"
    )
    pod_template_file: str | None = Field(default=None, description="else a YAML file holding that Pod manifest")
    bundle_store: str | None = Field(
        default=None, description="gs://bucket/prefix where workdir bundles go for the pods to fetch; none: no bundles"
    )
    bundle_gcp_conn_id: str = Field(
        default="google_cloud_default", description="the google_cloud_platform connection that writes bundle_store"
    )
    bundle_fetch_image: str = Field(
        default=DEFAULT_FETCH_IMAGE, description="the init container fetching a bundle (python3 3.11.4+ on PATH)"
    )

    _check_id = field_validator("id")(check_name)

    @field_validator("bundle_store")
    @classmethod
    def _bundle_store(cls, value: str | None) -> str | None:
        return check_bundle_store(value) if value is not None else None

    _check_names = field_validator("namespace", "queue_name")(_k8s_name)

    @field_validator("priority_classes")
    @classmethod
    def _bands(cls, value: dict[str, str]) -> dict[str, str]:
        return {_band_name(band): _k8s_name(name) for band, name in value.items()}

    @field_validator("other_priority_classes")
    @classmethod
    def _other_bands(cls, value: dict[str, str]) -> dict[str, str]:
        return {_k8s_name(name): _band_name(band) for name, band in value.items()}

    @model_validator(mode="after")
    def _serving_ports_clear_of_the_coordinator(self) -> KubernetesBackendConfig:
        if self.serving_port_base <= self.coordinator_port < self.serving_port_base + MAX_PORTS:
            raise ValueError(
                f"serving_port_base: ports {self.serving_port_base}-{self.serving_port_base + MAX_PORTS - 1} "
                f"would include coordinator_port {self.coordinator_port}; move one of them"
            )
        return self

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

    @field_validator("pod_template")
    @classmethod
    def _inline_template(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _checked_template(value) if value is not None else None

    @field_validator("pod_template_file")
    @classmethod
    def _template_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("pod_template") is not None:
            raise ValueError("give pod_template or pod_template_file, not both")
        _checked_template(_read_template(value))  # a bad file fails the config load, naming this field
        return value

    @model_validator(mode="after")
    def _one_connection(self) -> KubernetesBackendConfig:
        if self.gke is not None and "conn_id" in self.model_fields_set:
            # Raised as a ValidationError to name the field (a model validator's own would name the backend).
            problem = PydanticCustomError(
                "connection", "give conn_id (a kubernetes connection) or gke (a GKE cluster), not both"
            )
            raise ValidationError.from_exception_data(
                type(self).__name__, [InitErrorDetails(type=problem, loc=("gke",), input=self.gke.model_dump())]
            )
        return self

    def template(self) -> dict[str, Any] | None:
        """The pod template (the file's, read again: it was checked at load), or None."""
        if self.pod_template_file:
            return _checked_template(_read_template(self.pod_template_file))
        return self.pod_template

    def band_classes(self) -> dict[Band, str]:
        return {_parsed_band(band): name for band, name in self.priority_classes.items()}

    def class_bands(self) -> dict[str, Band]:
        """Every PriorityClass this backend knows, with its band (ours win over ``other_priority_classes``)."""
        known = {name: _parsed_band(band) for name, band in self.other_priority_classes.items()}
        known.update({name: band for band, name in self.band_classes().items()})
        return known


def _read_template(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).expanduser().read_text())
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not YAML: {error}") from None


def _checked_template(raw: Any) -> dict[str, Any]:
    try:
        return checked_pod_template(raw)
    except PodTemplateError as error:
        raise ValueError(str(error)) from None


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
