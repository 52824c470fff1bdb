"""The real control plane (``devtools/kube_cluster.py``) as one session fixture.

Its binaries are built by ``scripts/kube-binaries.sh`` (the first build takes a while); without
them the tests that need it skip, saying so, unless ``IRIS_REQUIRE_KUBERNETES=1``, which fails them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devtools.kube_cluster import KubeCluster, find_binaries


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    bin_dir = find_binaries()
    if bin_dir is None:
        message = "the Kubernetes control plane binaries are not built; run: bash scripts/kube-binaries.sh"
        if os.environ.get("IRIS_REQUIRE_KUBERNETES") == "1":
            pytest.fail(message + " (IRIS_REQUIRE_KUBERNETES=1)")
        pytest.skip(message)
    with KubeCluster(tmp_path_factory.mktemp("kube"), bin_dir) as kube:
        yield kube
