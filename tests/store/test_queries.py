"""Monitoring queries on SQLite and PostgreSQL: paging, filters, authorization scope, facets, counts."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.store.queries import JobFilter, JobScope, MonitoringQueries, job_dag_id
from iris_airflow_provider.store.records import NewIncarnation, Origin

NOW = 1_700_000_000_000
# The store knows no DAG by name: the caller names the one received jobs belong to (its runner DAG).
RUNNER_DAG_ID = "the_runner_dag"


def admit(store, job_id, *, user="alice", dag="train_dag", direction=Direction.SENT, peer="", at=NOW, backend=""):
    origin = Origin(dag, "manual__1", "run") if dag else None
    return store.admit(
        NewIncarnation(
            parse_job({"job_id": job_id, "command": "true"}),
            direction=direction,
            submitting_user=user,
            peer_id=peer,
            backend_id=backend,
            origin=origin,
        ),
        now_ms=at,
    ).job


def test_a_page_is_newest_first_with_the_total_of_every_match(store):
    for i in range(7):
        admit(store, f"/alice/job-{i}", at=NOW + i)
    queries = MonitoringQueries(store)
    first = queries.list_jobs(limit=3)
    second = queries.list_jobs(limit=3, offset=3)
    last = queries.list_jobs(limit=3, offset=6)
    assert [j.job_id for j in first.jobs] == ["/alice/job-6", "/alice/job-5", "/alice/job-4"]
    assert [j.job_id for j in second.jobs] == ["/alice/job-3", "/alice/job-2", "/alice/job-1"]
    assert [j.job_id for j in last.jobs] == ["/alice/job-0"]
    assert first.total == second.total == last.total == 7


def test_filters_combine_state_peer_submitter_dag_and_part_of_the_id(store):
    admit(store, "/alice/train_a", peer="cw-h100")
    admit(store, "/bob/train_b", user="bob", peer="cw-h100", dag="eval_dag")
    admit(store, "/alice/cpu_c", direction=Direction.LOCAL, backend="cpu")
    store.transition("/alice/train_a", to_state=JobState.RUNNING, now_ms=NOW + 1)
    queries = MonitoringQueries(store)

    def ids(**kwargs):
        return sorted(j.job_id for j in queries.list_jobs(JobFilter(**kwargs)).jobs)

    assert ids(states=(JobState.RUNNING,)) == ["/alice/train_a"]
    assert ids(peer_id="cw-h100") == ["/alice/train_a", "/bob/train_b"]
    assert ids(peer_id="") == ["/alice/cpu_c"]
    assert ids(submitter="bob") == ["/bob/train_b"]
    assert ids(dag_id="eval_dag") == ["/bob/train_b"]
    assert ids(directions=(Direction.LOCAL,)) == ["/alice/cpu_c"]
    # "_" is a LIKE wildcard: "n_a" must match "train_a" only, never "train_b" through "n" + any + "a".
    assert ids(job_id_contains="N_A") == ["/alice/train_a"]
    assert ids(job_id_contains="%") == []
    assert ids(peer_id="cw-h100", states=(JobState.PENDING,)) == ["/bob/train_b"]
    assert ids(active=False) == []
    store.transition("/bob/train_b", to_state=JobState.KILLED, now_ms=NOW + 2)
    assert ids(active=False) == ["/bob/train_b"]
    assert ids(active=True) == ["/alice/cpu_c", "/alice/train_a"]


def test_a_scope_shows_only_jobs_of_allowed_dags_and_runner_jobs_only_with_the_runner_dag(store):
    admit(store, "/alice/a", dag="dag_a")
    admit(store, "/alice/b", dag="dag_b")
    admit(store, "/script/no-dag", dag=None, direction=Direction.LOCAL, backend="cpu")
    received = admit(store, "/parent/received", dag=None, direction=Direction.RECEIVED, peer="marin", backend="cpu")
    assert job_dag_id(received, received_dag_id=RUNNER_DAG_ID) == RUNNER_DAG_ID
    assert job_dag_id(store.get_job("/alice/a"), received_dag_id=RUNNER_DAG_ID) == "dag_a"
    assert job_dag_id(store.get_job("/script/no-dag"), received_dag_id=RUNNER_DAG_ID) is None
    queries = MonitoringQueries(store)

    def ids(scope):
        return sorted(j.job_id for j in queries.list_jobs(scope=scope).jobs)

    def scope(*dag_ids, dagless=False):
        return JobScope(frozenset(dag_ids), dagless=dagless, received_dag_id=RUNNER_DAG_ID)

    assert ids(JobScope.everything()) == ["/alice/a", "/alice/b", "/parent/received", "/script/no-dag"]
    assert ids(scope("dag_a")) == ["/alice/a"]
    assert ids(scope("dag_b", RUNNER_DAG_ID)) == ["/alice/b", "/parent/received"]
    assert ids(scope()) == []
    assert ids(scope(dagless=True)) == ["/script/no-dag"]
    assert queries.list_jobs(scope=scope("dag_a")).total == 1
    assert queries.origin_dag_ids() == ["dag_a", "dag_b"]


def test_a_restricted_scope_must_name_the_dag_received_jobs_belong_to():
    with pytest.raises(ValueError, match="received_dag_id"):
        JobScope(frozenset({"dag_a"}), dagless=False)


def test_facets_count_states_and_list_peers_and_submitters_within_the_scope(store):
    admit(store, "/alice/a", peer="cw-h100", dag="dag_a")
    admit(store, "/bob/b", user="bob", peer="cw-gb200", dag="dag_b")
    store.transition("/bob/b", to_state=JobState.FAILED, now_ms=NOW + 1)
    queries = MonitoringQueries(store)
    everything = queries.facets()
    assert everything.states["pending"] == 1 and everything.states["failed"] == 1
    assert everything.states["running"] == 0
    assert everything.peers == ["cw-gb200", "cw-h100"]
    assert everything.submitters == ["alice", "bob"]
    only_a = queries.facets(JobScope(frozenset({"dag_a"}), dagless=False, received_dag_id=RUNNER_DAG_ID))
    assert (only_a.peers, only_a.submitters, only_a.states["failed"]) == (["cw-h100"], ["alice"], 0)


def test_active_counts_group_live_jobs_by_peer_backend_and_state(store):
    admit(store, "/alice/a", peer="cw", backend="default")
    admit(store, "/alice/b", peer="cw", backend="default")
    admit(store, "/alice/c", peer="cw", backend="default")
    store.transition("/alice/b", to_state=JobState.RUNNING, now_ms=NOW + 1)
    store.transition("/alice/c", to_state=JobState.SUCCEEDED, now_ms=NOW + 1)
    counts = {(c.peer_id, c.backend_id, c.state): c.count for c in MonitoringQueries(store).active_counts()}
    assert counts == {("cw", "default", JobState.PENDING): 1, ("cw", "default", JobState.RUNNING): 1}


def test_listing_reads_an_index_in_page_order_instead_of_sorting_the_table(sqlite_store):
    """The plans SQLite picks for the page's own queries: an index in page order, never a sort of every job
    (ties on the submit time are ordered by job id among themselves: "RIGHT PART OF ORDER BY")."""
    filters = [
        JobFilter(),
        JobFilter(states=(JobState.PENDING,)),
        JobFilter(peer_id="cw-h100"),
        JobFilter(submitter="alice"),
        JobFilter(dag_id="train_dag"),
    ]
    with sqlite_store.engine.connect() as connection:
        for job_filter in filters:
            page, _count = MonitoringQueries.page_queries(job_filter, JobScope(), limit=50, offset=100)
            sql = str(page.compile(sqlite_store.engine, compile_kwargs={"literal_binds": True}))
            plan = [row[-1] for row in connection.execute(sa.text("EXPLAIN QUERY PLAN " + sql))]
            assert "USING INDEX" in plan[0], (job_filter, plan)
            assert not any(step == "USE TEMP B-TREE FOR ORDER BY" for step in plan), (job_filter, plan)
