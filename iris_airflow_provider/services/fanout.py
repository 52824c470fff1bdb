"""Calling every peer at once: one thread per peer, one deadline for all of them."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from iris_airflow_provider.peers.base import Peer, PeerError, PeerErrorCode

T = TypeVar("T")


def each_peer(peers: Mapping[str, Peer], call: Callable[[Peer], T], timeout_s: float) -> dict[str, T | BaseException]:
    """Call each peer in parallel; a slow or failing peer never holds up the others."""
    if not peers:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(16, len(peers)), thread_name_prefix="iris-peer")
    futures = {peer_id: pool.submit(call, peer) for peer_id, peer in peers.items()}
    results: dict[str, T | BaseException] = {}
    deadline = time.monotonic() + timeout_s
    for peer_id, future in futures.items():
        try:
            results[peer_id] = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            results[peer_id] = PeerError(
                PeerErrorCode.UNAVAILABLE, f"peer {peer_id} did not answer within {timeout_s:g} s"
            )
        except Exception as error:  # one peer's bug must not stop the tick for the others
            results[peer_id] = error
    pool.shutdown(wait=False, cancel_futures=True)
    return results
