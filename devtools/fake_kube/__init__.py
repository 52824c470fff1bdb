"""A fake Kubernetes API server with a fake Kueue and a fake kubelet, for testing the ``kubernetes``
backend over real HTTP with the real ``kubernetes`` and ``kubernetes_asyncio`` clients.

No real API server can be installed from the registries these machines reach, so this one
implements exactly what the adapter relies on (see ``server`` and ``controllers``), validates every
body it receives against the Kubernetes OpenAPI schema, and runs each pod's command as a local
process so that exit codes and output are real. Not shipped in the package.

    with FakeKube(tmp_path, nodes=[...], priority_classes={...}, kueue={...}) as kube:
        kubeconfig = kube.kubeconfig(namespace="iris")
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "fake-admin-token"
ADAPTER_TOKEN = "fake-adapter-token"


class FakeKube:
    """The fake API server as a real process on a free loopback port."""

    def __init__(
        self,
        directory: Path,
        *,
        namespaces: Sequence[str] = ("default",),
        nodes: Sequence[Mapping[str, Any]] = (),
        priority_classes: Mapping[str, int] | None = None,
        kueue: Mapping[str, Any] | None = None,
        adapter_rules: Sequence[Mapping[str, Any]] | None = None,
        kube_version: str = "1.34",
    ) -> None:
        self.directory = Path(directory)
        self.config = {
            "namespaces": list(namespaces),
            "nodes": [dict(n) for n in nodes],
            "priority_classes": dict(priority_classes or {}),
            "kueue": dict(kueue or {}),
            "kube_version": kube_version,
            # The adapter's token holds only the given rules (RBAC); the admin's (test setup) all.
            "tokens": {ADMIN_TOKEN: "admin", ADAPTER_TOKEN: list(adapter_rules) if adapter_rules else "admin"},
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "fake-kube.log"

    def start(self, timeout: float = 30) -> FakeKube:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "fake-kube.json"
        config.write_text(json.dumps(self.config))
        ready = self.directory / "fake-kube.ready"
        ready.unlink(missing_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devtools.fake_kube",
                "--config",
                str(config),
                "--ready-file",
                str(ready),
                "--root",
                str(self.directory / "root"),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"the fake API server exited with {self.process.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the fake API server did not start within {timeout:g} s; see {self.log_path}")
            time.sleep(0.05)
        self.port = int(json.loads(ready.read_text())["port"])
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, *, namespace: str = "default", token: str = ADAPTER_TOKEN, name: str = "kubeconfig") -> Path:
        """A kubeconfig file pointing at this server, authenticating with ``token``."""
        path = self.directory / f"{name}.json"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": token}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def connection(self, *, namespace: str = "default", token: str = ADAPTER_TOKEN) -> str:
        """An Airflow ``kubernetes`` connection (as ``AIRFLOW_CONN_<ID>`` JSON) for this server."""
        kubeconfig = self.kubeconfig(namespace=namespace, token=token, name=f"kubeconfig-{token}")
        return json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig), "namespace": namespace}}
        )

    def admin_client(self) -> Any:
        """A ``kubernetes`` ApiClient with every permission, for a test's own setup and checks."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        return client.ApiClient(configuration)


__all__ = ["ADAPTER_TOKEN", "ADMIN_TOKEN", "FakeKube"]
