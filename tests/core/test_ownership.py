"""Who owns a job id and who may use one: namespaces, owners, service principals, received keys."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core.ownership import (
    Owner,
    OwnershipError,
    check_namespace,
    may_claim,
    qualified_job_id,
    received_job_key,
    service_principal_allowed,
    service_principal_refused,
    user_namespace,
    wire_job_id,
)


@pytest.mark.parametrize(
    ("user", "namespace"),
    [("alice", "alice"), ("alice@example.com", "alice@example.com"), ("Alice Smith", "Alice_Smith"), ("", "airflow")],
)
def test_a_users_namespace_is_a_valid_id_segment(user: str, namespace: str) -> None:
    assert user_namespace(user) == namespace
    assert qualified_job_id("train", user) == f"/{namespace}/train"
    check_namespace(f"/{namespace}/train", user)


def test_a_full_job_id_is_kept_as_given_and_must_be_in_the_submitters_namespace() -> None:
    assert qualified_job_id("/bob/train", "alice") == "/bob/train"
    for job_id in ("/bob/train", "/alicex/train", "/ali/train", "/airflow/train"):
        with pytest.raises(OwnershipError, match="outside the submitter's namespace"):
            check_namespace(job_id, "alice")
    with pytest.raises(OwnershipError, match=r"/airflow/<name>"):
        check_namespace("/alice/train", "")


def test_only_the_very_same_dag_task_and_user_may_claim_a_job() -> None:
    owner = Owner("train", "fit", "alice")
    assert may_claim(owner, Owner("train", "fit", "alice"))
    for other in (Owner("other", "fit", "alice"), Owner("train", "eval", "alice"), Owner("train", "fit", "bob")):
        assert not may_claim(owner, other)
    assert not may_claim(None, owner)


def test_service_principals_are_allowed_per_dag_by_glob() -> None:
    principals = {"ml-platform@example.com": ["training_*", "nightly_eval"]}
    assert service_principal_allowed("ml-platform@example.com", "training_llama", principals)
    assert service_principal_allowed("ml-platform@example.com", "nightly_eval", principals)
    assert not service_principal_allowed("ml-platform@example.com", "nightly_eval_2", principals)
    assert not service_principal_allowed("ml-platform@example.com", "Training_llama", principals)  # case matters
    assert not service_principal_allowed("someone@example.com", "training_llama", principals)
    assert not service_principal_allowed("ml-platform@example.com", "training_llama", {})
    message = service_principal_refused("bot", "etl")
    assert "submitter 'bot' is not allowed for DAG 'etl'" in message and "federation.service_principals" in message


def test_a_received_key_is_in_its_senders_namespace_and_maps_back() -> None:
    key = received_job_key("marin", "/alice/train")
    assert key == "marin:/alice/train" and wire_job_id("marin", key) == "/alice/train"
    assert received_job_key("cw", "/alice/train") != key


def test_a_received_key_names_a_job_in_the_store_like_a_job_id() -> None:
    from iris_airflow_provider.core.job_ids import JobIdError, check_job_key

    assert check_job_key("marin:/alice/train") == "marin:/alice/train"
    assert check_job_key("/alice/train") == "/alice/train"
    for bad in ("Marin:/alice/train", "marin:/alice", "marin:/../x", ":/alice/train", "marin/alice/train"):
        with pytest.raises(JobIdError):
            check_job_key(bad)
