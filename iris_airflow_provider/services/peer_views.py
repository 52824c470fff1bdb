"""The peers and capacity read model: what the Federation page's peer table, its JSON API and
``airflow iris-federation list-peers`` show.

:func:`peers_overview` answers the seed's list-peers shape (``{"peers": [{"peer_id",
"controller_address", "reachable", "last_contact_ms", "active_federated_jobs", "backends":
[{"backend_id", "kind", "advertised_attributes": {key: {"values": [...]}}, "pending_task_count",
"running_task_count", "availability": {...}}]}]}``), with numbers as JSON numbers rather than
proto3's strings, plus this cluster's own backends and :func:`capacity_by_variant` (free/total per
variant across local backends and reachable peers: an unreachable or stale peer's numbers are
unknown, not free). Read-only.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from iris_airflow_provider.backends.base import Backend
from iris_airflow_provider.core import reservations
from iris_airflow_provider.core.availability import PeerBackend
from iris_airflow_provider.core.holds import holding_text
from iris_airflow_provider.core.ledger import BackendKey
from iris_airflow_provider.core.peer_loss import peer_is_lost
from iris_airflow_provider.core.reservations import InFlight
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.queries import ActiveCount, MonitoringQueries
from iris_airflow_provider.store.records import BackendRecord

BACKEND_CAPACITY_CACHE_MS = 4_000

Counts = dict[tuple[Direction, str, str], dict[JobState, int]]

_capacity_cache: dict[int, tuple[Backend, int, PeerBackend]] = {}
_capacity_cache_lock = threading.Lock()


def advertised_wire(attributes: Mapping[str, Iterable[Any]]) -> dict[str, dict[str, list[Any]]]:
    """Advertised attributes in the list-peers shape: ``{"device-type": {"values": ["gpu"]}}``."""
    return {key: {"values": list(values)} for key, values in sorted(attributes.items())}


def _backend_entry(
    backend_id: str,
    kind: str,
    attributes: Mapping[str, Iterable[Any]],
    availability: Mapping[str, Any] | None,
    counts: Mapping[JobState, int],
) -> dict[str, Any]:
    return {
        "backend_id": backend_id,
        "kind": kind,
        "advertised_attributes": advertised_wire(attributes),
        "pending_task_count": counts.get(JobState.PENDING, 0) + counts.get(JobState.ACCEPTED, 0),
        "running_task_count": counts.get(JobState.RUNNING, 0),
        "availability": dict(availability) if availability is not None else None,
    }


def peers_overview(federation: Federation, now_ms: int) -> dict[str, Any]:
    """Peers (as last heartbeated), local backends (asked now) and the capacity by variant."""
    counts: Counts = defaultdict(dict)
    active_by_peer: dict[str, int] = defaultdict(int)
    for row in MonitoringQueries(federation.store).active_counts():
        _count(counts, row)
        if row.direction is Direction.SENT and row.peer_id:
            active_by_peer[row.peer_id] += row.count
    peers = _peer_entries(federation, now_ms, counts, active_by_peer)
    local = _local_entries(federation, now_ms, counts)
    return {
        "cluster": federation.config.name,
        "now_ms": now_ms,
        "heartbeat_staleness_ms": federation.staleness_ms,
        "peers": peers,
        "local_backends": local,
        "fleet": capacity_by_variant(federation.config.name, local, peers),
    }


def _peer_entries(
    federation: Federation, now_ms: int, counts: Counts, active_by_peer: Mapping[str, int]
) -> list[dict[str, Any]]:
    staleness_ms = federation.staleness_ms
    records = {record.peer_id: record for record in federation.store.peers()}
    reserving = reservations.in_force(federation.store.in_flight_handoffs(), federation.store.peer_states())
    holds = _holds_by_backend(federation, now_ms)
    leftovers: dict[str, int] = defaultdict(int)  # incarnations to terminate there once it answers
    for handoff in federation.store.abandoned_handoffs():
        leftovers[handoff.peer_id] += 1
    lost_ms = federation.lost_peers.peer_lost_ms
    peers = []
    for peer in sorted(federation.peers.values(), key=lambda p: p.peer_id):
        record = records.get(peer.peer_id)
        last_contact = record.last_contact_ms if record else None
        fresh = last_contact is not None and now_ms - last_contact <= staleness_ms
        backends: tuple[BackendRecord, ...] = record.backends if record else ()
        since = record.unreachable_since_ms if record else None
        peers.append(
            {
                "peer_id": peer.peer_id,
                "kind": peer.kind,
                "controller_address": peer.address,
                # What placement uses: answered the last heartbeat, and that was recent enough.
                "reachable": bool(record and record.reachable and fresh),
                "stale": bool(record and record.reachable and not fresh),
                "last_contact_ms": last_contact,
                "heartbeat_age_ms": now_ms - last_contact if last_contact is not None else None,
                "last_attempt_ms": record.last_attempt_ms if record else None,
                "last_error": record.last_error if record else "",
                # Lost (placement.peer_lost_seconds): its jobs were settled without it.
                "unreachable_since_ms": since,
                "unreachable_for_ms": now_ms - since if since is not None else None,
                "lost": bool(record and peer_is_lost(record.unreachable_since_ms, now_ms, lost_ms)),
                "superseded_incarnations": leftovers.get(peer.peer_id, 0),
                "active_federated_jobs": active_by_peer.get(peer.peer_id, 0),
                "backends": [
                    _with_reserved(
                        _backend_entry(
                            b.backend_id,
                            b.kind,
                            b.attributes,
                            b.availability,
                            counts.get((Direction.SENT, peer.peer_id, b.backend_id), {}),
                        ),
                        reserving.get((peer.peer_id, b.backend_id), []),
                        holds.get((peer.peer_id, b.backend_id)),
                    )
                    for b in backends
                ],
            }
        )
    return peers


def _local_entries(federation: Federation, now_ms: int, counts: Counts) -> list[dict[str, Any]]:
    local = []
    for backend_id, backend in sorted(federation.backends.items()):
        here = _merge(counts.get((Direction.LOCAL, "", backend_id), {}), _received(counts, backend_id))
        try:
            capacity = _backend_capacity(backend, now_ms)
        except Exception as error:  # a backend that cannot answer (e.g. its API is down) is shown as such
            entry = _backend_entry(backend_id, backend.kind, {}, None, here)
            entry["error"] = str(error) or type(error).__name__
        else:
            block = capacity.availability.to_wire() if capacity.availability else None
            entry = _backend_entry(backend_id, capacity.kind or backend.kind, capacity.advertised, block, here)
        local.append(entry)
    return local


def _backend_capacity(backend: Backend, now_ms: int) -> PeerBackend:
    """A local backend's capacity, asked at most every few seconds: every open page polls it, and a
    Kubernetes backend answers by listing nodes and pods."""
    key = id(backend)
    with _capacity_cache_lock:
        cached = _capacity_cache.get(key)
        if cached is not None and cached[0] is backend and now_ms - cached[1] < BACKEND_CAPACITY_CACHE_MS:
            return cached[2]
    capacity = backend.describe()
    with _capacity_cache_lock:
        _capacity_cache[key] = (backend, now_ms, capacity)
    return capacity


def _with_reserved(entry: dict[str, Any], reserving: list[InFlight], hold: dict[str, Any] | None) -> dict[str, Any]:
    """What placement does not offer again on this backend: capacity reserved for jobs handed off
    and not yet running there (until the peer's reports show them), and a hold for a starving job."""
    amounts = reservations.reserved_amounts(reserving)
    entry["reserved"] = amounts
    entry["reserved_jobs"] = [job.job_id for job in reserving]
    entry["reserved_note"] = reservations.reserved_note(amounts, len(reserving)) if amounts else ""
    entry["held_for"] = hold
    return entry


def _holds_by_backend(federation: Federation, now_ms: int) -> dict[BackendKey, dict[str, Any]]:
    """The starving job holding each backend (as the last tick left them), with how long it has waited."""
    held = federation.store.capacity_holds()
    jobs = federation.store.get_jobs(held)
    out = {}
    for job_id, (peer_id, backend_id) in held.items():
        job = jobs.get(job_id)
        if job is None or job.terminal:
            continue
        waited_ms = max(0, now_ms - job.submitted_at_ms)
        out[(peer_id, backend_id)] = {
            "job_id": job_id,
            "waiting_ms": waited_ms,
            "text": holding_text(peer_id, backend_id, job_id, waited_ms),
        }
    return out


def _count(counts: Counts, row: ActiveCount) -> None:
    bucket = counts[(row.direction, row.peer_id, row.backend_id)]
    bucket[row.state] = bucket.get(row.state, 0) + row.count


def _received(
    counts: Mapping[tuple[Direction, str, str], Mapping[JobState, int]], backend_id: str
) -> dict[JobState, int]:
    merged: dict[JobState, int] = {}
    for (direction, _peer, backend), states in counts.items():
        if direction is Direction.RECEIVED and backend == backend_id:
            merged = _merge(merged, states)
    return merged


def _merge(a: Mapping[JobState, int], b: Mapping[JobState, int]) -> dict[JobState, int]:
    return {state: a.get(state, 0) + b.get(state, 0) for state in set(a) | set(b)}


def capacity_by_variant(cluster: str, local: list[dict[str, Any]], peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Free/total per device variant over local backends and reachable peers, with each target's share."""
    by_variant: dict[str, dict[str, Any]] = {}
    targets = [(cluster, b) for b in local]
    targets += [(peer["peer_id"], b) for peer in peers if peer["reachable"] for b in peer["backends"]]
    for owner, backend in targets:
        block = backend.get("availability") or {}
        totals = block.get("total_amounts") or {}
        free = block.get("amounts") or {}
        for variant in sorted(set(totals) | set(free)):
            entry = by_variant.setdefault(
                variant, {"variant": variant, "free": 0, "total": 0, "reserved": 0, "targets": []}
            )
            reserved = int((backend.get("reserved") or {}).get(variant, 0))
            entry["free"] += int(free.get(variant, 0))
            entry["total"] += int(totals.get(variant, 0))
            entry["reserved"] += reserved
            entry["targets"].append(
                {
                    "target": f"{owner}/{backend['backend_id']}",
                    "free": int(free.get(variant, 0)),
                    "total": int(totals.get(variant, 0)),
                    "reserved": reserved,
                }
            )
    return [by_variant[variant] for variant in sorted(by_variant)]
