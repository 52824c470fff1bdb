"""Single-use peer tokens in the store: a jti is accepted once, until it expires, by however many
api-servers share the store; expired entries are pruned, and a peer's live entries are capped."""

from __future__ import annotations

import multiprocessing
from collections import Counter

import sqlalchemy as sa

from iris_airflow_provider.store.schema import seen_tokens
from iris_airflow_provider.store.seen_tokens import PRUNE_BATCH, TokenUse
from iris_airflow_provider.store.store import FederationStore

NOW = 1_700_000_000_000
LATER = NOW + 330_000
MAX = 1_000


def use(store: FederationStore, jti: str, *, issuer: str = "marin", until: int = LATER, now: int = NOW) -> TokenUse:
    return store.use_token(issuer, jti, until, now, max_live=MAX)


def rows(store: FederationStore) -> int:
    with store.engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(seen_tokens)).scalar_one())


def test_a_token_is_accepted_once_and_a_replay_is_refused_until_it_expires(store):
    assert use(store, "j1") is TokenUse.FIRST
    assert use(store, "j1") is TokenUse.REUSED
    assert use(store, "j1", now=LATER) is TokenUse.REUSED  # up to the last moment it could be presented
    assert use(store, "j2") is TokenUse.FIRST


def test_jtis_are_per_calling_cluster(store):
    """A peer cannot spend another peer's tokens by guessing or copying their jti."""
    assert use(store, "j1", issuer="marin") is TokenUse.FIRST
    assert use(store, "j1", issuer="cw-west") is TokenUse.FIRST
    assert use(store, "j1", issuer="cw-west") is TokenUse.REUSED


def test_expired_entries_are_pruned_by_later_inserts(store):
    for n in range(5):
        use(store, f"old-{n}", until=NOW + 1)
    assert store.live_tokens(NOW) == 5
    use(store, "new", now=NOW + 2)  # the five could no longer be presented: gone
    assert rows(store) == 1 and store.live_tokens(NOW + 2) == 1


def test_pruning_takes_a_bounded_batch_per_insert(store):
    with store.engine.begin() as connection:
        connection.execute(
            seen_tokens.insert(),
            [{"issuer": "marin", "jti": f"old-{n}", "usable_until_ms": NOW} for n in range(PRUNE_BATCH + 10)],
        )
    use(store, "a", now=NOW + 1)
    assert rows(store) == 10 + 1
    use(store, "b", now=NOW + 1)
    assert rows(store) == 2


def test_a_peer_over_its_cap_of_live_tokens_is_refused_and_others_are_not(store):
    for n in range(3):
        assert store.use_token("marin", f"j{n}", LATER, NOW, max_live=3) is TokenUse.FIRST
    assert store.use_token("marin", "j3", LATER, NOW, max_live=3) is TokenUse.TOO_MANY
    assert store.use_token("marin", "j0", LATER, NOW, max_live=3) is TokenUse.REUSED  # a replay is still a replay
    assert store.use_token("cw-west", "j3", LATER, NOW, max_live=3) is TokenUse.FIRST
    assert rows(store) == 4
    # Once its tokens expire, the peer is served again.
    assert store.use_token("marin", "j3", LATER * 2, LATER + 1, max_live=3) is TokenUse.FIRST


JTIS = 40
SERVERS = 4


def _api_server(url: str, barrier, results) -> None:  # type: ignore[no-untyped-def]
    """One api-server presented with every token (a replay of each, racing the others)."""
    store = FederationStore.from_url(url)
    barrier.wait()
    accepted = [jti for jti in (f"jti-{n}" for n in range(JTIS)) if use(store, jti) is TokenUse.FIRST]
    results.put(accepted)
    store.dispose()


def test_api_servers_sharing_a_store_accept_each_token_exactly_once(store):
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(SERVERS)
    results = context.Queue()
    servers = [context.Process(target=_api_server, args=(store.url, barrier, results)) for _ in range(SERVERS)]
    for server in servers:
        server.start()
    accepted = Counter(jti for _ in servers for jti in results.get(timeout=120))
    for server in servers:
        server.join(timeout=30)
        assert server.exitcode == 0
    assert accepted == Counter({f"jti-{n}": 1 for n in range(JTIS)})
