"""fake-gcs-server, a real Google Cloud Storage emulator (the JSON and XML APIs), on loopback for
tests, from the binary ``scripts/gcs-emulator.sh`` builds. No Airflow import.

    server = find_server()                        # None when it was never built
    with GcsEmulator(tmp_path, server) as gcs:
        gcs.url                                   # http://127.0.0.1:<port>; the google clients
                                                  # reach it with STORAGE_EMULATOR_HOST=gcs.url
        gcs.create_bucket("bundles")

Objects live under ``<directory>/storage``, its log in ``<directory>/fake-gcs-server.log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from devtools.kube_cluster import free_port

REPO = Path(__file__).resolve().parents[1]


def find_server() -> Path | None:
    """The fake-gcs-server binary, from ``IRIS_GCS_SERVER`` or the build script's cache."""
    if os.environ.get("IRIS_GCS_SERVER"):
        path = Path(os.environ["IRIS_GCS_SERVER"])
        return path if path.exists() else None
    try:  # --check only locates a build, it never builds
        out = subprocess.run(
            ["bash", str(REPO / "scripts/gcs-emulator.sh"), "--check"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else None


class GcsEmulator:
    def __init__(self, directory: Path, server: Path) -> None:
        self.directory = directory
        self.server = server
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GcsEmulator:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = (self.directory / "fake-gcs-server.log").open("wb")
        # external-url and public-host make the upload and media links it returns point here,
        # not at storage.googleapis.com.
        self._process = subprocess.Popen(
            [
                str(self.server),
                "-scheme=http",
                "-host=127.0.0.1",
                f"-port={self.port}",
                "-backend=filesystem",
                f"-filesystem-root={self.directory / 'storage'}",
                f"-external-url={self.url}",
                f"-public-host=127.0.0.1:{self.port}",
                "-log-level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).close()
                return self
            except (urllib.error.URLError, ConnectionError):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    log_path = self.directory / "fake-gcs-server.log"
                    raise RuntimeError(f"fake-gcs-server did not start; see {log_path}") from None
                time.sleep(0.1)

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
