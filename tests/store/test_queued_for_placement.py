"""The tick's narrow read of the queue gives the candidates parsing every queued job's spec gives."""

from __future__ import annotations

import sqlalchemy as sa

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.services.placement import projected_candidates, queued_candidates
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.store.schema import jobs
from iris_airflow_provider.store.store import FederationStore

NOW = 1_700_000_000_000
USER = "alice@example.com"
DOCUMENTS = [
    {"job_id": "/alice/cpu"},
    {
        "job_id": "/alice/gpu",
        "resources": {"device": {"type": "gpu", "variant": "h100", "count": 4}, "replicas": 2},
        "regions": ["us-east", "eu-west"],
        "priority_band": "production",
        "scheduling_deadline_ms": NOW + 60_000,
    },
    {"job_id": "/alice/pinned", "target_cluster": "cw-a", "constraints": [{"key": "zone", "op": "EQ", "value": "z1"}]},
    {
        "job_id": "/alice/tpu",
        "resources": {"device": {"type": "tpu", "variant": "v5p-8", "count": 4}},
        "priority_band": "batch",
    },
    {"job_id": "/alice/requeued", "resources": {"device": {"type": "gpu", "variant": "a100", "count": 1}}},
    {"job_id": "/alice/legacy", "resources": {"device": {"type": "gpu", "variant": "gb200", "count": 2}}},
]


def test_the_projection_read_gives_the_candidates_of_the_parsed_specs(store: FederationStore) -> None:
    for offset, document in enumerate(DOCUMENTS):
        new = NewIncarnation(spec=parse_job(document), direction=Direction.SENT, submitting_user=USER)
        store.admit(new, NOW + offset)
    # One requeued job avoids a peer that refused it (as a requeue leaves the row); one row
    # predates the projection column.
    with store.engine.begin() as connection:
        connection.execute(sa.update(jobs).where(jobs.c.job_id == "/alice/legacy").values(placement=None))
        connection.execute(
            sa.update(jobs)
            .where(jobs.c.job_id == "/alice/requeued")
            .values(requeue_count=1, avoided_peers={"cw-b": NOW + 600_000, "cw-c": NOW - 1})
        )

    expected = queued_candidates(store, store.queued_jobs(), NOW)
    got = projected_candidates(store, NOW)

    assert sorted(got, key=lambda c: c.job_id) == sorted(expected, key=lambda c: c.job_id)
    by_id = {c.job_id: c for c in got}
    assert len(by_id) == len(DOCUMENTS)
    assert by_id["/alice/requeued"].avoided_peer_ids == frozenset({"cw-b"})  # cw-c's avoidance is over
    assert by_id["/alice/gpu"].gate == (("h100", 8),)
    assert by_id["/alice/legacy"].gate == (("gb200", 2),)  # parsed from its spec


def test_a_queued_record_parses_its_spec_once(store: FederationStore) -> None:
    store.admit(NewIncarnation(spec=parse_job(DOCUMENTS[1]), direction=Direction.SENT, submitting_user=USER), NOW)
    [record] = store.queued_jobs()
    assert record.job_spec is record.job_spec
    assert record.job_spec.gate == {"h100": 8}
