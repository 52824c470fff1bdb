"""A GKE cluster as the Kubernetes backend's connection, through the google provider's GKE hooks.

``GKEHook.get_cluster`` (by the provider's own ``GKEClusterAuthDetails``, which picks the public,
private or DNS endpoint as GKE operators do) gives the control plane's address and CA; a
``GKEKubernetesHook`` then serves the same clients as the cncf provider's ``KubernetesHook``
(``core_v1_client``, ``batch_v1_client``), authenticated by the Google Cloud connection's
credentials (a key, Workload Identity, impersonation ...), its token refreshed before it expires.
Everything else in the backend is unchanged. Imported only by backends that name ``gke:``: the
google provider is an optional dependency (the ``google`` extra).

The backend is synchronous (its calls run in the tick's and the heartbeat's threads), so the
provider's async hooks have no caller here.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook, GKEKubernetesHook
from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails
from airflow.providers.google.common.consts import CLIENT_INFO
from airflow.providers.google.common.hooks.base_google import PROVIDE_PROJECT_ID
from google.api_core.exceptions import GoogleAPIError
from google.auth.exceptions import GoogleAuthError
from google.cloud.container_v1 import ClusterManagerClient
from kubernetes.client.rest import RESTClientObject
from requests import RequestException
from urllib3.util.retry import Retry

from iris_airflow_provider.backends.kubernetes.config import GKECluster

# What fetching the cluster or a token raises when Google is unreachable or refuses (the Container
# API's REST transport lets ``requests``' own errors through): the backend reports itself
# unavailable (the tick retries), as for an unreachable API server.
GOOGLE_ERRORS: tuple[type[Exception], ...] = (GoogleAPIError, GoogleAuthError, RequestException)


class _EndpointGKEHook(GKEHook):
    """``GKEHook`` calling the Container API at ``api_endpoint`` over REST (the hook itself always
    calls Google's gRPC endpoint): the provider's own ``get_client_options`` override, as its other
    hooks pass regional endpoints."""

    def __init__(self, *, api_endpoint: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api_endpoint = api_endpoint

    def get_cluster_manager_client(self) -> ClusterManagerClient:
        if self._client is None:
            self._client = ClusterManagerClient(
                credentials=self.get_credentials(),
                client_info=CLIENT_INFO,
                client_options=self.get_client_options(api_endpoint_override=self.api_endpoint),
                transport="rest",
            )
        client: ClusterManagerClient = self._client
        return client


def cluster_hook(cluster: GKECluster) -> Any:
    """The provider's ``GKEHook`` for the cluster's location (on ``api_endpoint`` when set)."""
    settings: dict[str, Any] = {
        "gcp_conn_id": cluster.gcp_conn_id,
        "location": cluster.location,
        "impersonation_chain": list(cluster.impersonation_chain) or None,
    }
    if cluster.api_endpoint:
        return _EndpointGKEHook(api_endpoint=cluster.api_endpoint, **settings)
    return GKEHook(**settings)


def gke_kubernetes_hook(cluster: GKECluster, retries: Retry) -> Any:
    """A ``GKEKubernetesHook`` on the cluster (its endpoint and CA fetched now), whose API client
    retries connections as ``retries`` says (status codes are ``api.retried``'s to handle)."""
    url, ca = GKEClusterAuthDetails(
        cluster_name=cluster.cluster_name,
        project_id=cluster.project_id or PROVIDE_PROJECT_ID,  # the connection's project (the hook's fallback)
        use_internal_ip=cluster.use_internal_ip,
        use_dns_endpoint=cluster.use_dns_endpoint,
        cluster_hook=cluster_hook(cluster),
    ).fetch_cluster_info()
    hook = GKEKubernetesHook(
        cluster_url=url,
        ssl_ca_cert=ca,
        use_dns_endpoint=cluster.use_dns_endpoint,
        gcp_conn_id=cluster.gcp_conn_id,
        impersonation_chain=list(cluster.impersonation_chain) or None,
        kubernetes_conn_id=None,  # no kubernetes connection: the namespace is the backend's, else default
    )
    # The provider builds the client's configuration itself: urllib3's default retries there would
    # also wait out a 429's or 503's Retry-After, silently, under ``retried``. Rebuild its pool with ours.
    api_client = hook.api_client
    api_client.configuration.retries = retries
    api_client.rest_client = RESTClientObject(api_client.configuration)
    return hook
