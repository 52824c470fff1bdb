"""The fake API server holds clients to the rules the backend relies on, as a real one would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devtools.fake_kube import FakeKube

GATE = "kueue.x-k8s.io/admission"


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKube]:
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"], "namespace": ""}]
    with FakeKube(
        tmp_path_factory.mktemp("fake-kube-rules"),
        nodes=[{"name": "n1", "labels": {"pool": "a"}, "allocatable": {"nvidia.com/gpu": "2"}}],
        adapter_rules=rules,
    ) as kube:
        yield kube


@pytest.fixture(scope="module")
def core(kube: FakeKube) -> client.CoreV1Api:
    return client.CoreV1Api(kube.admin_client())


def pod(name: str, *, gated: bool = False, resources: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "30"], "resources": resources or {}}],
            **spec,
        },
    }
    if gated:
        body["spec"]["schedulingGates"] = [{"name": GATE}]
    return body


def refused(call: Any, *args: Any, **kwargs: Any) -> ApiException:
    with pytest.raises(ApiException) as error:
        call(*args, **kwargs)
    return error.value


def test_objects_get_uid_resource_version_and_creation_time(core):
    created = core.create_namespaced_pod("default", pod("meta"))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    again = refused(core.create_namespaced_pod, "default", pod("meta"))
    assert (again.status, '"reason": "AlreadyExists"' in again.body) == (409, True)
    stale = core.read_namespaced_pod("meta", "default")
    core.patch_namespaced_pod("meta", "default", {"metadata": {"labels": {"touched": "yes"}}})
    conflict = refused(core.replace_namespaced_pod, "meta", "default", stale)
    assert conflict.status == 409 and "the object has been modified" in conflict.body
    wrong_uid = refused(core.delete_namespaced_pod, "meta", "default", body={"preconditions": {"uid": "nope"}})
    assert wrong_uid.status == 409 and "Precondition failed: UID" in wrong_uid.body
    core.delete_namespaced_pod("meta", "default", grace_period_seconds=0)


def test_scheduling_gates_can_only_be_removed_and_node_selectors_only_added_while_gated(core):
    core.create_namespaced_pod("default", pod("gated", gated=True))
    gated = core.read_namespaced_pod("gated", "default")
    assert gated.status.phase == "Pending"
    [scheduled] = [c for c in gated.status.conditions if c.type == "PodScheduled"]
    assert (scheduled.status, scheduled.reason) == ("False", "SchedulingGated")
    added = refused(
        core.patch_namespaced_pod,
        "gated",
        "default",
        [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "x/y"}}],
    )
    assert added.status == 422 and "only deletion is allowed" in added.body
    core.patch_namespaced_pod("gated", "default", {"spec": {"nodeSelector": {"pool": "a"}}})  # allowed while gated
    core.patch_namespaced_pod("gated", "default", [{"op": "remove", "path": "/spec/schedulingGates"}])
    time.sleep(0.3)
    released = core.read_namespaced_pod("gated", "default")
    assert released.spec.node_name == "n1" and released.spec.scheduling_gates is None
    changed = refused(core.patch_namespaced_pod, "gated", "default", {"spec": {"nodeSelector": {"pool": "b"}}})
    assert changed.status == 422 and "immutable" in changed.body
    core.delete_namespaced_pod("gated", "default", grace_period_seconds=0)


def test_extended_resources_need_equal_integer_requests_and_limits(core):
    unequal = refused(
        core.create_namespaced_pod,
        "default",
        pod("unequal", resources={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}),
    )
    assert unequal.status == 422 and "must be equal to nvidia.com/gpu limit" in unequal.body
    no_limit = refused(
        core.create_namespaced_pod, "default", pod("no-limit", resources={"requests": {"nvidia.com/gpu": "1"}})
    )
    assert no_limit.status == 422 and "Limit must be set for non overcommitable resources" in no_limit.body
    created = core.create_namespaced_pod("default", pod("limit-only", resources={"limits": {"nvidia.com/gpu": "1"}}))
    assert created.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}
    core.delete_namespaced_pod("limit-only", "default", grace_period_seconds=0)


def test_bodies_are_validated_against_the_openapi_schema(core):
    body = pod("typo")
    body["spec"]["containers"][0]["comand"] = ["true"]
    error = refused(core.create_namespaced_pod, "default", body)
    assert error.status == 422 and "'comand' was unexpected" in error.body


def test_label_and_field_selectors_and_pages(core):
    for name, labels in (("sel-a", {"team": "x", "tier": "gpu"}), ("sel-b", {"team": "y"}), ("sel-c", {"team": "z"})):
        core.create_namespaced_pod("default", pod(name, labels=labels, gated=True))
    names = lambda result: sorted(p.metadata.name for p in result.items)  # noqa: E731
    assert names(core.list_namespaced_pod("default", label_selector="team in (x,y)")) == ["sel-a", "sel-b"]
    assert names(core.list_namespaced_pod("default", label_selector="team,!tier")) == ["sel-b", "sel-c"]
    assert names(core.list_namespaced_pod("default", label_selector="team notin (x)")) == ["sel-b", "sel-c"]
    assert "sel-a" not in names(core.list_namespaced_pod("default", field_selector="status.phase!=Pending"))
    bad = refused(core.list_namespaced_pod, "default", field_selector="spec.colour=red")
    assert bad.status == 400 and "field label not supported" in bad.body
    first = core.list_namespaced_pod("default", label_selector="team", limit=2)
    assert len(first.items) == 2 and first.metadata._continue
    rest = core.list_namespaced_pod("default", label_selector="team", limit=2, _continue=first.metadata._continue)
    assert names(first) + names(rest) == ["sel-a", "sel-b", "sel-c"] and not rest.metadata._continue
    for name in ("sel-a", "sel-b", "sel-c"):
        core.delete_namespaced_pod(name, "default")


def test_callers_are_authenticated_and_held_to_their_rbac(kube):
    from kubernetes import config

    adapter = client.CoreV1Api(config.new_client_from_config(config_file=str(kube.kubeconfig())))
    assert adapter.list_pod_for_all_namespaces().kind == "PodList"
    denied = refused(adapter.list_node)
    assert denied.status == 403 and 'cannot list resource \\"nodes\\"' in denied.body
    stranger = client.CoreV1Api(
        config.new_client_from_config(config_file=str(kube.kubeconfig(token="nobody", name="x")))
    )
    assert refused(stranger.list_pod_for_all_namespaces).status == 401
