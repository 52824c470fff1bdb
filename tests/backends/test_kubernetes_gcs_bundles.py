"""The Kubernetes backend's bundle store through the google provider's real ``GCSHook``, against a
real GCS emulator (fake-gcs-server): one upload per digest, named by it, bytes intact."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.request
from pathlib import Path

import pytest

from iris_airflow_provider.backends.kubernetes.gcs_bundles import GcsBundleStore, check_bundle_store


@pytest.fixture
def gcs(gcs_emulator, monkeypatch: pytest.MonkeyPatch):
    # The google clients honour STORAGE_EMULATOR_HOST; an anonymous connection needs no key.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
    connection = {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": "iris-test"}}
    monkeypatch.setenv("AIRFLOW_CONN_BUNDLES_GCS", json.dumps(connection))
    return gcs_emulator


def read_object(gcs, name: str) -> bytes:
    quoted = urllib.request.quote(name, safe="")
    with urllib.request.urlopen(f"{gcs.url}/storage/v1/b/iris-bundles/o/{quoted}?alt=media", timeout=30) as answer:
        return answer.read()


def test_a_bundle_is_uploaded_once_under_its_digest(gcs, tmp_path: Path) -> None:
    data = os.urandom(9 << 20)  # past the client's 8 MiB threshold: a resumable upload
    bundle = tmp_path / "bundle"
    bundle.write_bytes(data)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    store = GcsBundleStore("gs://iris-bundles/team-a/bundles", gcp_conn_id="bundles_gcs")

    assert store.put(digest, bundle) is True
    assert store.put(digest, bundle) is False  # already there: nothing sent again

    name = f"team-a/bundles/sha256/{digest[7:]}"
    assert store.object_url(digest) == f"gs://iris-bundles/{name}"
    assert read_object(gcs, name) == data


def test_a_store_at_the_bucket_root(gcs, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.write_bytes(b"tar bytes")
    digest = "sha256:" + hashlib.sha256(b"tar bytes").hexdigest()
    store = GcsBundleStore("gs://iris-bundles/", gcp_conn_id="bundles_gcs")

    store.put(digest, bundle)

    assert store.object_url(digest) == f"gs://iris-bundles/sha256/{digest[7:]}"
    assert read_object(gcs, f"sha256/{digest[7:]}") == b"tar bytes"


@pytest.mark.parametrize("url", ["gs://iris-bundles", "gs://iris-bundles/a/b/", "gs://my_bucket.v2/x=1/y-z"])
def test_store_urls_accepted(url: str) -> None:
    assert check_bundle_store(url) == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("s3://iris-bundles/x", "must be gs://<bucket>/<prefix>"),
        ("gs://Upper/x", "must be gs://<bucket>/<prefix>"),
        ("gs://ab/x", "must be gs://<bucket>/<prefix>"),
        ("gs://iris-bundles/a/../b", "no '.' or '..' segments"),
        ("gs://iris-bundles//a", "single '/'"),
        ("gs://iris-bundles/a b", "letters, digits"),
    ],
)
def test_store_urls_refused(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        check_bundle_store(url)
