"""A handed-off job's serving URLs in the store: written with the state its peer reports, by the same
compare-and-set on the incarnation's nonce (another incarnation's never lands), the first ones kept for
the incarnation, and cleared when it ends, is requeued or runs again as a new incarnation."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.peer_loss import LostRequeue
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.store.store import FederationStore, RequeueOutcome
from tests.store.test_lifecycle import JOB, get, handed_off
from tests.store.test_store import NOW

URLS = {"http": "https://iris.example.com/proxy/t/cluster=cw/eyJ.eyJ.sig/http/"}
LATER = {"http": "https://iris.example.com/proxy/t/cluster=cw/eyJ.eyJ.later/http/"}


def running(store: FederationStore, nonce: str, urls: dict[str, str] | None, now: int = NOW + 10) -> bool:
    return store.mirror(JobReport(JOB, nonce, JobState.RUNNING, "default", serving_urls=urls), now)


def test_the_urls_land_with_the_running_state_and_the_first_ones_stay(store):
    job = handed_off(store)
    assert job.serving_urls is None
    assert running(store, job.nonce, URLS)
    assert get(store).serving_urls == URLS and get(store).state is JobState.RUNNING
    # Reported again (a peer mints anew on every answer): what users were given stays valid.
    assert not running(store, job.nonce, LATER, NOW + 11)
    assert get(store).serving_urls == URLS


def test_urls_arriving_after_the_state_are_written_on_their_own(store):
    job = handed_off(store)
    assert running(store, job.nonce, None)  # an older peer, or not minted yet
    assert get(store).serving_urls is None
    assert running(store, job.nonce, {}, NOW + 11) is False  # {}: nothing serves yet
    assert get(store).serving_urls is None
    assert running(store, job.nonce, URLS, NOW + 12)
    assert get(store).serving_urls == URLS


def test_another_incarnations_urls_never_land(store):
    job = handed_off(store)
    assert not running(store, "an-earlier-nonce", URLS)
    assert get(store).serving_urls is None and get(store).nonce == job.nonce


def test_reports_of_many_jobs_in_one_transaction_each_keep_their_own(store):
    first = handed_off(store)
    other = handed_off(store, "/alice/other")
    third = handed_off(store, "/alice/third")
    reports = [
        JobReport(JOB, first.nonce, JobState.RUNNING, "default", serving_urls=URLS),
        JobReport("/alice/other", other.nonce, JobState.RUNNING, "default"),
        JobReport("/alice/third", third.nonce, JobState.RUNNING, "default", serving_urls=LATER),
    ]
    assert store.mirror_many(reports, NOW + 10) == {JOB, "/alice/other", "/alice/third"}
    assert get(store, "/alice/third").serving_urls == LATER
    assert get(store).serving_urls == URLS
    assert get(store, "/alice/other").serving_urls is None


@pytest.mark.parametrize("end", [JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED])
def test_the_end_of_the_incarnation_clears_them(store, end):
    job = handed_off(store)
    assert running(store, job.nonce, URLS)
    assert store.mirror(JobReport(JOB, job.nonce, end, "default", exit_code=0, serving_urls=URLS), NOW + 20)
    assert get(store).serving_urls is None


def test_a_cancel_before_the_peer_reports_the_end_clears_them(store):
    job = handed_off(store)
    assert running(store, job.nonce, URLS)
    assert store.mark_gone(JOB, job.nonce, NOW + 20)
    assert get(store).terminal and get(store).serving_urls is None


def test_a_requeue_clears_them_for_the_next_incarnation(store):
    job = handed_off(store)
    assert running(store, job.nonce, URLS)
    record = get(store)
    decision = LostRequeue("Peer cw lost for 15 min; the job's state there is unknown")
    outcome = store.settle_lost(record, decision, now_ms=NOW + 20, avoid_until_ms=NOW + 100, max_requeues=3)
    assert outcome is RequeueOutcome.REQUEUED
    requeued = get(store)
    assert requeued.nonce != job.nonce and requeued.serving_urls is None
    assert not running(store, job.nonce, URLS, NOW + 21)  # the old incarnation's answer, late
    assert get(store).serving_urls is None


def test_a_new_incarnation_starts_without_them(store):
    job = handed_off(store)
    assert running(store, job.nonce, URLS)
    store.transition(JOB, to_state=JobState.FAILED, now_ms=NOW + 20)
    again = store.reincarnate(
        NewIncarnation(job.job_spec, direction=Direction.SENT, submitting_user="alice@example.com"), now_ms=NOW + 30
    )
    assert again is not None and again.nonce != job.nonce and again.serving_urls is None
