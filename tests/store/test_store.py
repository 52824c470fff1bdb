"""The federation store on SQLite and PostgreSQL: migrations, admission, conditional transitions,
heartbeats, what jobs in flight reserve, holds and leases."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.availability import Availability, PeerBackend
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.holds import Hold
from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.reservations import InFlight
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.records import HandoffRefusal, NewIncarnation, Origin
from iris_airflow_provider.store.schema import VERSION_TABLE, capacity_holds, jobs, metadata

NOW = 1_700_000_000_000


def spec(job_id: str = "/alice/train", **extra):
    return parse_job(
        {"job_id": job_id, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}}, **extra}
    )


def queue(store, job_id="/alice/train", *, pin="", now=NOW, **extra):
    return store.admit(
        NewIncarnation(
            spec(job_id, **extra), direction=Direction.SENT, submitting_user="alice@example.com", peer_id=pin
        ),
        now_ms=now,
    ).job


def promotion(job_id="/alice/train", peer="cw", backend="default", reserved=None, epoch=NOW - 5):
    return Promotion(job_id, peer, backend, False, reserved if reserved is not None else {"h100": 8}, epoch)


def test_migrations_build_exactly_the_declared_schema(store):
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        differences = compare_metadata(context, metadata)
    assert differences == []


def test_migrating_twice_is_harmless(store):
    store.migrate()
    assert store.get_job("/nobody/here") is None


def test_the_schema_refuses_states_it_does_not_know(store):
    queue(store)
    with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as connection:
        connection.execute(jobs.update().values(state="sleeping"))
    with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as connection:
        connection.execute(jobs.update().values(direction="local"))  # a handoff state on a local job


class TestAdmission:
    def test_a_queued_job_is_pending_with_no_peer_and_a_fresh_nonce(self, store):
        origin = Origin("train_dag", "manual__1", "submit", -1)
        admission = store.admit(
            NewIncarnation(spec(), direction=Direction.SENT, submitting_user="alice@example.com", origin=origin),
            now_ms=NOW,
        )
        job = admission.job
        assert admission.created
        assert (job.direction, job.handoff_state, job.state) == (Direction.SENT, HandoffState.QUEUED, JobState.PENDING)
        assert job.peer_id == "" and len(job.nonce) == 32
        assert job.origin == origin
        assert job.job_spec == spec()
        assert job.pending_reason == reasons.QUEUED_UNPINNED
        assert [e.kind for e in store.events("/alice/train")] == ["admitted"]

    def test_admitting_the_same_job_again_returns_the_existing_one_untouched(self, store):
        first = queue(store)
        again = store.admit(NewIncarnation(spec(), direction=Direction.SENT, submitting_user="mallory"), now_ms=NOW + 9)
        assert not again.created
        assert again.job == first
        assert len(store.events("/alice/train")) == 1

    def test_a_pinned_job_names_its_peer_while_queued(self, store):
        job = queue(store, pin="cw-rno2a")
        assert job.pending_reason == "Queued for peer cw-rno2a to report free capacity"


class TestPromotion:
    def test_promotion_moves_a_queued_job_to_pending_once(self, store):
        queue(store)
        assert store.promote(promotion(), NOW + 1)
        assert not store.promote(promotion(peer="other"), NOW + 2)
        job = store.get_job("/alice/train")
        assert (job.handoff_state, job.peer_id, job.backend_id) == (HandoffState.PENDING, "cw", "default")
        assert job.pending_reason == "Awaiting acceptance by peer cw"
        assert store.queued_jobs() == []

    def test_a_cancelled_job_is_never_promoted(self, store):
        queue(store)
        outcome = store.request_cancel("/alice/train", NOW + 1)
        assert outcome.killed and outcome.notify_peer == ""
        assert not store.promote(promotion(), NOW + 2)
        job = store.get_job("/alice/train")
        assert (job.state, job.error, job.handoff_state) == (
            JobState.KILLED,
            reasons.CANCELLED_BEFORE_HANDOFF,
            HandoffState.QUEUED,
        )
        assert store.in_flight_handoffs() == []

    def test_an_expired_job_is_never_promoted(self, store):
        queue(store, "/alice/late", scheduling_deadline_ms=NOW + 10)
        queue(store, "/alice/ok", scheduling_deadline_ms=NOW + 100)
        queue(store, "/alice/forever")
        assert store.expire_queued(NOW + 50) == ["/alice/late"]
        late = store.get_job("/alice/late")
        assert (late.state, late.error) == (JobState.UNSCHEDULABLE, reasons.SCHEDULING_TIMEOUT)
        assert not store.promote(promotion("/alice/late"), NOW + 51)
        assert store.expire_queued(NOW + 60) == []
        assert {j.job_id for j in store.queued_jobs()} == {"/alice/ok", "/alice/forever"}

    def test_a_pinned_job_is_only_promoted_to_its_pin(self, store):
        queue(store, pin="cw-a")
        assert not store.promote(promotion(peer="cw-b"), NOW + 1)
        assert store.promote(promotion(peer="cw-a"), NOW + 1)

    def test_only_confirmed_promotions_reserve_capacity(self, store):
        queue(store, "/alice/a")
        queue(store, "/alice/b")
        store.request_cancel("/alice/b", NOW)
        confirmed = store.apply_promotions([promotion("/alice/a"), promotion("/alice/b")], NOW + 1)
        assert [p.job_id for p in confirmed] == ["/alice/a"]
        assert store.in_flight_handoffs() == [InFlight("/alice/a", "cw", "default", {"h100": 8})]
        assert [e.kind for e in store.events("/alice/a")] == ["admitted", "promoted"]


class TestReservations:
    """The job row is the reservation: made by the promotion, shown by reports, ended by the job."""

    def report(self, store, job_id: str, state: JobState, now: int) -> None:
        nonce = store.get_job(job_id).nonce
        assert store.mirror(JobReport(job_id, nonce, state, "default"), now)

    def test_a_report_that_the_job_holds_capacity_is_recorded_once_when_it_first_comes(self, store):
        queue(store, "/alice/a")
        store.promote(promotion("/alice/a"), NOW)
        self.report(store, "/alice/a", JobState.PENDING, NOW + 1)  # queued at the peer: holds nothing
        assert store.in_flight_handoffs() == [InFlight("/alice/a", "cw", "default", {"h100": 8}, None)]
        self.report(store, "/alice/a", JobState.ACCEPTED, NOW + 2)
        self.report(store, "/alice/a", JobState.RUNNING, NOW + 3)
        assert store.in_flight_handoffs() == [InFlight("/alice/a", "cw", "default", {"h100": 8}, NOW + 2)]

    def test_a_finished_or_requeued_job_reserves_nothing_and_its_next_incarnation_starts_afresh(self, store):
        queue(store, "/alice/a")
        queue(store, "/alice/b")
        store.apply_promotions([promotion("/alice/a"), promotion("/alice/b")], NOW)
        self.report(store, "/alice/a", JobState.RUNNING, NOW + 1)
        self.report(store, "/alice/a", JobState.SUCCEEDED, NOW + 2)
        job = store.get_job("/alice/b")
        refusal = HandoffRefusal("/alice/b", job.nonce, "cw", "too small", NOW + 100)
        store.requeue_handoff(refusal, max_requeues=3, now_ms=NOW + 3)
        assert store.in_flight_handoffs() == []
        assert store.get_job("/alice/b").holding_since_ms is None

    def test_ungated_and_force_routed_jobs_are_in_flight_with_no_gate(self, store):
        store.admit(NewIncarnation(parse_job({"job_id": "/u/cpu"}), direction=Direction.SENT, submitting_user="u"), NOW)
        store.promote(Promotion("/u/cpu", "cw", "", False, {}, None), NOW)
        assert store.in_flight_handoffs() == [InFlight("/u/cpu", "cw", "", {})]

    def test_a_heartbeat_records_when_it_was_asked_for(self, store):
        store.record_heartbeat("cw", NOW + 50, [_gpu_backend("x", epoch=100)], asked_at_ms=NOW + 10)
        [state] = store.peer_states()
        assert (state.last_contact_ms, state.observed_after_ms) == (NOW + 50, NOW + 10)
        store.record_heartbeat("cw", NOW + 90, None, error="down")  # no answer: the numbers stay as asked
        [state] = store.peer_states()
        assert (state.reachable, state.observed_after_ms) == (False, NOW + 10)


class TestHolds:
    def hold(self, job_id: str, peer: str = "cw", backend: str = "default") -> Hold:
        return Hold(job_id, peer, backend, {"h100": 32}, {"h100": 8}, 60_000)

    def test_holds_are_saved_replaced_and_ended_by_a_promotion(self, store):
        for name in "abc":
            queue(store, f"/alice/{name}")
        assert store.save_holds([self.hold("/alice/a"), self.hold("/alice/b", backend="x")], NOW) == {
            "/alice/a": ("cw", "default"),
            "/alice/b": ("cw", "x"),
        }
        assert store.save_holds([self.hold("/alice/a"), self.hold("/alice/c", backend="x")], NOW + 1) == {
            "/alice/a": ("cw", "default"),
            "/alice/c": ("cw", "x"),
        }
        store.apply_promotions([promotion("/alice/a")], NOW + 2)
        assert store.capacity_holds() == {"/alice/c": ("cw", "x")}

    def test_a_hold_is_never_written_for_a_job_that_left_the_queue_since_the_pass(self, store):
        """The pass read /alice/a and /alice/b as queued; a cancel and a promotion land before the save."""
        for name in "abc":
            queue(store, f"/alice/{name}")
        store.save_holds([self.hold("/alice/a", backend="old")], NOW)
        planned = [self.hold("/alice/a"), self.hold("/alice/b", backend="x"), self.hold("/alice/c", backend="y")]
        store.request_cancel("/alice/a", NOW + 1)
        store.promote(promotion("/alice/b", backend="z"), NOW + 1)
        assert store.save_holds(planned, NOW + 2) == {"/alice/c": ("cw", "y")}

    def test_each_backend_holds_for_one_job_at_most(self, store):
        for name in "ab":
            queue(store, f"/alice/{name}")
        assert store.save_holds([self.hold("/alice/a"), self.hold("/alice/b")], NOW) == {"/alice/a": ("cw", "default")}
        second = capacity_holds.insert().values(job_id="/alice/b", peer_id="cw", backend_id="default", held_since_ms=1)
        with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as connection:
            connection.execute(second)

    def test_holds_on_peers_no_longer_configured_are_dropped(self, store):
        queue(store, "/alice/a")
        store.save_holds([self.hold("/alice/a", peer="gone")], NOW)
        store.forget_peers(["cw"])
        assert store.capacity_holds() == {}


def _gpu_backend(backend_id: str, *, epoch: int, free: int = 8, version: int = 2) -> PeerBackend:
    availability = Availability(version, epoch, {"h100": free}, {"h100": 64}, {Band.BATCH: {"h100": 40}})
    return PeerBackend(
        backend_id,
        normalize_advertised({"device-type": ["gpu"], "device-variant": ["h100"]}),
        availability,
        "kubernetes",
    )


class TestCancel:
    def test_cancel_of_a_handoff_never_sent_kills_it_with_nothing_to_tell(self, store):
        queue(store)
        store.promote(promotion(), NOW)
        outcome = store.request_cancel("/alice/train", NOW + 1)
        assert outcome.killed and outcome.notify_peer == ""
        job = store.get_job("/alice/train")
        assert (job.state, job.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)
        assert job.cancel_intent_version == 1 and store.pending_cancels() == []

    @pytest.mark.parametrize("attempt", ["in_flight", "failed"])
    def test_cancel_of_a_handoff_a_delivery_may_have_reached_asks_the_peer_first(self, store, attempt):
        job = queue(store)
        store.promote(promotion(), NOW)
        assert store.begin_delivery("/alice/train", job.nonce, NOW, stale_before_ms=NOW - 1)
        if attempt == "failed":
            store.defer_delivery("/alice/train", job.nonce, "unavailable: reset", NOW + 60_000, NOW)
            store.release_delivery("/alice/train", job.nonce)
        outcome = store.request_cancel("/alice/train", NOW + 1)
        assert not outcome.killed and outcome.notify_peer == "cw"
        job = store.get_job("/alice/train")
        assert job.state is JobState.PENDING and [j.job_id for j in store.pending_cancels()] == ["/alice/train"]

    def test_cancel_after_handoff_records_intent_and_leaves_the_state_to_the_peer(self, store):
        queue(store)
        store.promote(promotion(), NOW)
        with store.engine.begin() as connection:
            connection.execute(jobs.update().values(handoff_state="handed_off"))
        outcome = store.request_cancel("/alice/train", NOW + 1)
        assert not outcome.killed and outcome.notify_peer == "cw"
        job = store.get_job("/alice/train")
        assert job.state is JobState.PENDING and job.cancel_requested

    def test_cancel_of_a_finished_or_unknown_job(self, store):
        queue(store)
        store.transition("/alice/train", to_state=JobState.SUCCEEDED, now_ms=NOW)
        assert store.request_cancel("/alice/train", NOW + 1).was_terminal
        assert not store.request_cancel("/nobody/job", NOW + 1).found


class TestTransitions:
    def test_a_transition_only_applies_from_the_expected_states(self, store):
        store.admit(
            NewIncarnation(spec(), direction=Direction.LOCAL, submitting_user="alice", backend_id="proc"), now_ms=NOW
        )
        assert not store.transition(
            "/alice/train", to_state=JobState.SUCCEEDED, from_states=[JobState.RUNNING], now_ms=NOW
        )
        assert store.transition("/alice/train", to_state=JobState.RUNNING, now_ms=NOW + 1)
        assert store.transition("/alice/train", to_state=JobState.FAILED, exit_code=3, error="boom", now_ms=NOW + 2)
        assert not store.transition("/alice/train", to_state=JobState.RUNNING, now_ms=NOW + 3)  # terminal stays
        job = store.get_job("/alice/train")
        assert (job.state, job.exit_code, job.error, job.started_at_ms, job.finished_at_ms) == (
            JobState.FAILED,
            3,
            "boom",
            NOW + 1,
            NOW + 2,
        )
        assert job.row_version == 3


class TestHeartbeats:
    def test_a_heartbeat_round_trips_into_core_peer_states(self, store):
        shape_only = PeerBackend("legacy", normalize_advertised({"device-type": ["gpu"]}))
        store.record_heartbeat("cw", NOW, [_gpu_backend("default", epoch=NOW - 3), shape_only])
        (peer,) = store.peer_states()
        assert peer.reachable and peer.last_contact_ms == NOW
        default, legacy = sorted(peer.backends, key=lambda b: b.backend_id)
        assert default.availability == Availability(2, NOW - 3, {"h100": 8}, {"h100": 64}, {Band.BATCH: {"h100": 40}})
        assert default.kind == "kubernetes" and default.tracked
        assert legacy.availability is None

    def test_a_failed_heartbeat_keeps_the_last_backends_but_marks_the_peer_unreachable(self, store):
        store.record_heartbeat("cw", NOW, [_gpu_backend("default", epoch=1)])
        store.record_heartbeat("cw", NOW + 30_000, None, error="connection refused")
        (record,) = store.peers()
        assert not record.reachable and record.last_contact_ms == NOW and record.last_error == "connection refused"
        assert [b.backend_id for b in record.backends] == ["default"]

    def test_a_block_of_a_newer_version_is_kept_but_not_tracked(self, store):
        store.record_heartbeat("cw", NOW, [_gpu_backend("future", epoch=5, version=3)])
        (peer,) = store.peer_states()
        assert not peer.backends[0].tracked


class TestLeases:
    def test_one_holder_at_a_time_until_expiry(self, store):
        assert store.acquire_lease("tick", "a", NOW, 1_000)
        assert not store.acquire_lease("tick", "b", NOW + 10, 1_000)
        assert store.acquire_lease("tick", "a", NOW + 10, 1_000)  # renewal
        assert store.acquire_lease("tick", "b", NOW + 1_010, 1_000)  # expired: taken over
        store.release_lease("tick", "a")  # not the holder any more: no effect
        assert not store.acquire_lease("tick", "a", NOW + 1_020, 1_000)
        store.release_lease("tick", "b")
        assert store.acquire_lease("tick", "a", NOW + 1_030, 1_000)


class TestIncarnations:
    def test_a_refused_start_fails_only_the_incarnation_it_was_for(self, store):
        first = queue(store)
        assert not store.fail_start(first.job_id, "a-newer-nonce", "refused", NOW + 1)
        assert store.get_job(first.job_id).state is JobState.PENDING
        assert store.fail_start(first.job_id, first.nonce, "refused: no such image", NOW + 2)
        job = store.get_job(first.job_id)
        assert (job.state, job.error, job.finished_at_ms) == (JobState.FAILED, "refused: no such image", NOW + 2)
        assert not store.fail_start(first.job_id, first.nonce, "again", NOW + 3)  # ended: stays as it ended
        assert store.get_job(first.job_id).error == "refused: no such image"

    def test_only_a_finished_job_can_run_again_and_it_starts_from_scratch(self, store):
        first = queue(store)
        assert (
            store.reincarnate(
                NewIncarnation(spec(), direction=Direction.SENT, submitting_user="alice@example.com"), now_ms=NOW + 1
            )
            is None
        )
        store.promote(promotion(), NOW + 1)
        store.append_logs(first.job_id, first.nonce, ["line"], '{"0": 5}', NOW + 2)
        store.transition(first.job_id, to_state=JobState.FAILED, exit_code=3, error="boom", now_ms=NOW + 3)
        again = store.reincarnate(
            NewIncarnation(spec(), direction=Direction.SENT, submitting_user="alice@example.com"), now_ms=NOW + 4
        )
        assert again is not None and again.nonce != first.nonce
        assert (again.state, again.handoff_state, again.peer_id, again.backend_id) == (
            JobState.PENDING,
            HandoffState.QUEUED,
            "",
            "",
        )
        assert (again.error, again.exit_code, again.finished_at_ms, again.log_cursor) == ("", None, None, "")
        assert again.submitted_at_ms == NOW + 4
        assert [e.kind for e in store.events(first.job_id)][-1] == "resubmitted"
