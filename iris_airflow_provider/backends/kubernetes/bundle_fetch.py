"""The init container that puts a job's bundle into its workdir on a Kubernetes backend with a
``bundle_store``: it downloads ``gs://<bucket>/<object>`` with the pod's own credentials, checks
the archive's sha256 against the digest the job was submitted with, and unpacks it.

This module's source is the container's program (``python3 -c``): it runs in the backend's
``bundle_fetch_image``, so it uses the Python standard library only and imports nothing of the
package. Credentials are the pod's, never the submitter's: on GKE the metadata server's token of the
pod's service account (Workload Identity); with ``STORAGE_EMULATOR_HOST`` set (the variable the
google clients honour) it talks to that emulator without a token.

    IRIS_BUNDLE_URL=gs://bucket/prefix/sha256/<hex> IRIS_BUNDLE_DIGEST=sha256:<hex> \\
    IRIS_BUNDLE_DIR=/iris/workdir python3 -c "$(cat bundle_fetch.py)"

Exit codes: 0 unpacked; 1 the download failed (the last error on stderr); 2 the digest differs;
3 the archive is unsafe (a member outside the workdir, a device, a link out); 4 the image's Python
is too old to judge an archive (``tarfile.data_filter``, 3.11.4 or later).
"""

import hashlib
import json
import os
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

# What each of the program's exit codes means, for the job's error (``status.py``).
EXIT_MEANINGS = {
    1: "its workdir bundle could not be downloaded (see the init container's log)",
    2: "its workdir bundle in the bundle store is not the one submitted (digest mismatch)",
    3: "its workdir bundle holds a path outside the workdir, a link out or a device",
    4: "bundle_fetch_image has no python3 of 3.11.4 or later",
}
METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
ATTEMPTS = 5  # 429 and 5xx are retried with backoff; anything else fails at once
CHUNK = 1 << 20


def _token() -> str:
    request = urllib.request.Request(METADATA_TOKEN, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return str(json.load(answer)["access_token"])


def _media_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "gs" or not parsed.netloc or not parsed.path.strip("/"):
        raise SystemExit(f"IRIS_BUNDLE_URL must be gs://<bucket>/<object>, got {url!r}")
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
    obj = urllib.parse.quote(parsed.path.lstrip("/"), safe="")
    return f"{endpoint.rstrip('/')}/storage/v1/b/{parsed.netloc}/o/{obj}?alt=media"


def _download(url: str, into: "tempfile._TemporaryFileWrapper[bytes]") -> str:
    """Streams the object into ``into``; returns its sha256."""
    headers = {} if os.environ.get("STORAGE_EMULATOR_HOST") else {"Authorization": f"Bearer {_token()}"}
    for attempt in range(ATTEMPTS):
        digest = hashlib.sha256()
        into.seek(0)
        into.truncate()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as answer:
                while chunk := answer.read(CHUNK):
                    digest.update(chunk)
                    into.write(chunk)
            into.flush()
            return digest.hexdigest()
        except urllib.error.HTTPError as error:
            if (error.code != 429 and error.code < 500) or attempt == ATTEMPTS - 1:
                raise SystemExit(f"bundle download failed: HTTP {error.code} {error.reason} for {url}") from None
            time.sleep(float(error.headers.get("Retry-After") or 2**attempt))
        except (urllib.error.URLError, OSError) as error:
            if attempt == ATTEMPTS - 1:
                raise SystemExit(f"bundle download failed: {error} for {url}") from None
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def main() -> int:
    if not hasattr(tarfile, "data_filter"):  # PEP 706: 3.11.4+, 3.12+
        version = sys.version.split()[0]
        print(f"bundle_fetch_image runs Python {version}; unpacking safely needs 3.11.4 or later", file=sys.stderr)
        return 4
    url, expected, workdir = (os.environ[k] for k in ("IRIS_BUNDLE_URL", "IRIS_BUNDLE_DIGEST", "IRIS_BUNDLE_DIR"))
    os.makedirs(workdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=workdir, prefix=".bundle-") as archive:
        actual = "sha256:" + _download(_media_url(url), archive)
        if actual != expected:
            print(f"bundle {url}: its digest {actual} is not the submitted {expected}", file=sys.stderr)
            return 2
        archive.seek(0)
        with tarfile.open(fileobj=archive, mode="r:*") as tar:
            # Every member is judged before any is written: an unsafe archive leaves the workdir empty.
            try:
                for member in tar.getmembers():
                    tarfile.data_filter(member, workdir)  # absolute paths, '..', devices, links out
            except tarfile.FilterError as error:
                print(f"bundle {url}: unsafe archive: {error}", file=sys.stderr)
                return 3
            tar.extractall(workdir, filter="data")
    print(f"bundle {expected[:19]} unpacked into {workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
