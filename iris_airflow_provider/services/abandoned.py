"""Stopping superseded incarnations: one a peer may have admitted before its job was sent back to
the queue (a requeue, a lost peer), or that it admitted after the job ended or moved on. Each is
terminated there by its nonce and forgotten only once the peer says it is over (or never had it),
so a later incarnation is never placed beside it. Peers are asked in parallel; a peer removed from
the configuration cannot be asked, and its leftovers are forgotten after a grace period
(:mod:`iris_airflow_provider.core.grace`)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping

from iris_airflow_provider.core.grace import abandoned_on_unconfigured_peer_expired
from iris_airflow_provider.peers.base import Peer, Termination
from iris_airflow_provider.services.fanout import each_peer
from iris_airflow_provider.services.ports import AbandonedStore
from iris_airflow_provider.store.store import AbandonedHandoff

log = logging.getLogger(__name__)


def terminate_abandoned(
    store: AbandonedStore, peers: Mapping[str, Peer], clock: Callable[[], int], timeout_s: float
) -> list[str]:
    """Stop leftover incarnations on their peers; the ids of the jobs whose leftover was terminated."""
    by_peer: dict[str, list[AbandonedHandoff]] = defaultdict(list)
    now = clock()
    for handoff in store.abandoned_handoffs():
        if handoff.peer_id in peers:
            by_peer[handoff.peer_id].append(handoff)
        elif abandoned_on_unconfigured_peer_expired(handoff.abandoned_at_ms, now):
            store.forget_abandoned(handoff, now, terminated=False)
    terminated_ids: list[str] = []

    def terminate_all(peer: Peer) -> None:
        for handoff in by_peer[peer.peer_id]:
            where = peer.terminate(handoff.job_id, handoff.nonce)  # a PeerError: asked again next tick
            if where is Termination.STOPPING:
                log.info(
                    "Peer %s is stopping %s (incarnation %s); asking again", peer.peer_id, handoff.job_id, handoff.nonce
                )
                continue
            terminated = where is Termination.ENDED
            store.forget_abandoned(handoff, clock(), terminated=terminated)
            if terminated:
                log.warning("Terminated %s on peer %s: %s", handoff.job_id, peer.peer_id, handoff.reason)
                terminated_ids.append(handoff.job_id)

    for peer_id, result in each_peer({p: peers[p] for p in by_peer}, terminate_all, timeout_s).items():
        if isinstance(result, BaseException):
            log.info("Could not reach peer %s about jobs left there by a requeue: %s", peer_id, result)
    return terminated_ids
