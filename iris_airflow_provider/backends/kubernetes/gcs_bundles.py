"""A Kubernetes backend's ``bundle_store``: where the cluster puts a job's workdir bundle for its
pods to fetch, a Google Cloud Storage prefix (``gs://bucket/prefix``).

The backend writes the bundle through the google provider's ``GCSHook`` (its connection, its
credentials) before it creates the Job, once per digest: an object already there is not sent
again. The pods read it with their own credentials, through the init container of
``bundle_fetch.py``, which checks the digest before unpacking anything, so an object that was
replaced or damaged in the bucket fails the job rather than running other code.

Objects are named ``<prefix>/sha256/<hex>``: content-addressed, so one upload serves every job and
every retry with the same workdir, and a bucket lifecycle rule can expire them by age.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# GCS bucket names: 3-63 characters of lowercase letters, digits, '-', '_' and '.', starting and
# ending with a letter or digit (dotted names up to 222 are for domain-verified buckets only).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"[A-Za-z0-9_.=/-]*")
# The init container's image: it needs python3 (3.11.4+ for tarfile's data filter) and nothing else.
DEFAULT_FETCH_IMAGE = "python:3.12-slim"


def check_bundle_store(url: str) -> str:
    """``url`` as given, or ValueError saying what a bundle store URL looks like."""
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    if scheme != "gs" or not _BUCKET.fullmatch(bucket):
        raise ValueError(f"must be gs://<bucket>/<prefix> (a Google Cloud Storage bucket name), got {url!r}")
    segments = prefix.rstrip("/").split("/") if prefix else []
    if not _PREFIX.fullmatch(prefix) or any(p in ("", ".", "..") for p in segments):
        raise ValueError(
            f"the prefix of {url!r} may hold letters, digits, '_', '.', '=', '-' and single '/' only "
            "(no '.' or '..' segments)"
        )
    return url


@dataclass(frozen=True, slots=True)
class GcsBundleStore:
    url: str  # gs://bucket/prefix, checked by check_bundle_store
    gcp_conn_id: str = "google_cloud_default"

    @property
    def bucket(self) -> str:
        return self.url.removeprefix("gs://").partition("/")[0]

    def object_name(self, digest: str) -> str:
        """Where the bundle of ``digest`` (``sha256:<hex>``) lives in the bucket."""
        algorithm, _, hexdigest = digest.partition(":")
        prefix = self.url.removeprefix("gs://").partition("/")[2].strip("/")
        return "/".join(part for part in (prefix, algorithm, hexdigest) if part)

    def object_url(self, digest: str) -> str:
        return f"gs://{self.bucket}/{self.object_name(digest)}"

    def put(self, digest: str, path: Path) -> bool:
        """Uploads the bundle at ``path`` unless the bucket has it already; True when it was sent."""
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        hook = GCSHook(gcp_conn_id=self.gcp_conn_id)
        name = self.object_name(digest)
        if hook.exists(self.bucket, name):
            return False
        # A resumable upload, streamed from the file; two backends racing on one digest write the
        # same bytes, and the pods check the digest whatever is there.
        hook.upload(self.bucket, name, filename=str(path), mime_type="application/x-tar")
        return True
