"""The cluster configuration file: YAML or JSON, the built-in default, and errors that name the file
and the path of every bad field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.cluster.build import build_local_backends, build_peers
from iris_airflow_provider.cluster.config import (
    AgentlessPeerConfig,
    ClusterConfig,
    load_cluster_config,
    parse_cluster_config,
)
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.peers.identity import generate_keypair

EXAMPLE_YAML = """\
name: marin
default_region: us-central1
state_dir: {state_dir}
placement:
  tick_interval_seconds: 15
  sync_interval_seconds: 5
  max_handoffs_per_cycle: 2
  heartbeat_staleness_seconds: 60
  heartbeat_timeout_seconds: 3
  delivery_timeout_seconds: 30
backends:
  - id: cpu
    kind: process
    max_running_jobs: 4
    attributes: {{region: [us-central1]}}
    env: {{TEAM: ml}}
peers:
  - id: cw-h100
    kind: agentless
    backends: [{{id: default, kind: process, devices: {{H100: 8}}}}]
  - id: cw-gb200
    kind: agentless
    backends:
      - {{id: default, kind: process, devices: {{gb200: 4}}, state_dir: {gb200_dir}}}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(error: pytest.ExceptionInfo[SpecError]) -> dict[str, str]:
    return {problem.path: problem.message for problem in error.value.problems}


# Loading ----------------------------------------------------------------------------------------


def test_a_yaml_file_is_loaded_with_every_setting(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "cluster.yaml",
        EXAMPLE_YAML.format(state_dir=tmp_path / "state", gb200_dir=tmp_path / "elsewhere"),
    )
    config = load_cluster_config(path)
    assert config.name == "marin" and config.default_region == "us-central1"
    placement = config.placement
    assert (
        placement.tick_interval_seconds,
        placement.sync_interval_seconds,
        placement.max_handoffs_per_cycle,
        placement.heartbeat_staleness_seconds,
        placement.heartbeat_timeout_seconds,
        placement.delivery_timeout_seconds,
    ) == (15, 5, 2, 60, 3, 30)
    [cpu] = config.backends
    assert (cpu.id, cpu.max_running_jobs, cpu.attributes, cpu.env, cpu.devices) == (
        "cpu",
        4,
        {"region": ["us-central1"]},
        {"TEAM": "ml"},
        {},
    )
    assert [peer.id for peer in config.peers] == ["cw-h100", "cw-gb200"]
    h100, gb200 = config.peers
    assert isinstance(h100, AgentlessPeerConfig) and isinstance(gb200, AgentlessPeerConfig)
    assert h100.backends[0].devices == {"h100": 8}  # variants are lowercased
    # Where each backend keeps its jobs: <state_dir>/<owner>/<backend>, unless it says otherwise.
    assert config.backend_state_dir("marin", cpu) == tmp_path / "state" / "marin" / "cpu"
    assert config.backend_state_dir("cw-h100", h100.backends[0]) == tmp_path / "state/cw-h100/default"
    assert config.backend_state_dir("cw-gb200", gb200.backends[0]) == tmp_path / "elsewhere"


def test_the_same_document_as_json_gives_the_same_configuration(tmp_path: Path) -> None:
    document = {
        "name": "marin",
        "state_dir": str(tmp_path / "state"),
        "backends": [{"id": "cpu", "kind": "process", "max_running_jobs": 2}],
        "peers": [{"id": "cw", "kind": "agentless", "backends": [{"id": "default", "kind": "process"}]}],
    }
    from_json = load_cluster_config(write(tmp_path, "cluster.json", json.dumps(document)))
    from_yaml = load_cluster_config(write(tmp_path, "cluster.yml", json.dumps(document)))  # JSON is YAML too
    assert from_json == from_yaml == parse_cluster_config(document)
    assert from_json.placement.tick_interval_seconds == 30  # defaults fill what is not given
    assert from_json.placement.heartbeat_staleness_seconds == 120


@pytest.mark.parametrize("path", [None, ""])
def test_without_a_file_the_cluster_is_local_with_one_cpu_backend(
    path: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    config = load_cluster_config(path)
    assert config.name == "local" and config.peers == []
    [backend] = config.backends
    assert (backend.id, backend.kind, backend.max_running_jobs, backend.devices) == ("local", "process", 4, {})
    assert config.resolved_state_dir() == tmp_path / "airflow" / "iris"
    assert config.backend_state_dir("local", backend) == tmp_path / "airflow/iris/local/local"


def test_the_configuration_builds_its_backends_and_agentless_peers(tmp_path: Path) -> None:
    config = load_cluster_config(
        write(tmp_path, "c.yaml", EXAMPLE_YAML.format(state_dir=tmp_path / "state", gb200_dir=tmp_path / "g"))
    )
    backends = build_local_backends(config)
    assert list(backends) == ["cpu"]
    cpu = backends["cpu"]
    assert isinstance(cpu, ProcessBackend)
    assert cpu.state_dir == tmp_path / "state/marin/cpu" and cpu.env == {"TEAM": "ml"}
    assert dict(cpu.describe().advertised) == {"device-type": ("cpu",), "region": ("us-central1",)}
    peers = build_peers(config)
    assert list(peers) == ["cw-h100", "cw-gb200"]
    h100 = peers["cw-h100"]
    assert isinstance(h100, AgentlessPeer)
    [described] = h100.heartbeat()
    assert described.availability is not None and described.availability.total_amounts == {"h100": 8}
    assert dict(described.advertised)["device-type"] == ("gpu",)  # devices imply a GPU backend


# Errors -----------------------------------------------------------------------------------------


def test_duplicate_ids_are_named_with_their_path(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "dup.yaml",
        """\
name: marin
backends: [{id: cpu, kind: process}, {id: cpu, kind: process}]
peers:
  - {id: cw, kind: agentless, backends: [{id: a, kind: process}]}
  - {id: cw, kind: agentless, backends: [{id: a, kind: process}]}
""",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    assert problems(error) == {
        f"{path}: backends": "id must be unique; repeated: cpu",
        f"{path}: peers": "id must be unique; repeated: cw",
    }
    inner = write(
        tmp_path,
        "inner.yaml",
        "name: marin\npeers: [{id: cw, kind: agentless, backends: [{id: a, kind: process}, {id: a, kind: process}]}]\n",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(inner)
    assert problems(error) == {f"{inner}: peers[0].backends": "id must be unique; repeated: a"}


def test_a_peer_cannot_carry_the_clusters_own_name(tmp_path: Path) -> None:
    # Its backends would share the state directories of this cluster's own backends.
    with pytest.raises(SpecError) as error:
        parse_cluster_config(
            {
                "name": "marin",
                "backends": [{"id": "default", "kind": "process"}],
                "peers": [{"id": "marin", "kind": "agentless", "backends": [{"id": "default", "kind": "process"}]}],
            },
            source="c.yaml",
        )
    assert problems(error) == {"c.yaml: peers": "a peer cannot be named 'marin': that is this cluster's own name"}


def test_an_airflow_peer_over_plain_http_is_refused_naming_the_field_and_the_remedy(tmp_path: Path) -> None:
    path = write(
        tmp_path, "http.yaml", "name: marin\npeers: [{id: cw-east, kind: airflow, url: 'http://cw-east:8080'}]\n"
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    assert problems(error) == {
        f"{path}: peers[0].url": "'http://cw-east:8080' is plain http://, which sends peer tokens and jobs in the "
        "clear: use https://, or set allow_insecure_http: true on this peer (tests and local demos only)"
    }


def test_plain_http_is_allowed_for_a_peer_that_says_so_and_https_always(tmp_path: Path) -> None:
    key = tmp_path / "marin.key"
    key.write_text(generate_keypair()[0])
    config = parse_cluster_config(
        {
            "name": "marin",
            "federation": {"private_key": str(key)},
            "peers": [
                {"id": "local-peer", "kind": "airflow", "url": "http://127.0.0.1:8081", "allow_insecure_http": True},
                {"id": "cw-east", "kind": "airflow", "url": "https://airflow.cw-east.example.com/"},
            ],
        }
    )
    peers = build_peers(config)
    assert peers["local-peer"].address == "http://127.0.0.1:8081"
    assert peers["cw-east"].address == "https://airflow.cw-east.example.com"


def test_bad_names_are_refused_with_what_is_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "names.yaml",
        "name: Marin\nbackends: [{id: 'has space', kind: process}]\n"
        "peers: [{id: -cw, kind: agentless, backends: [{id: ok, kind: process}]}]\n",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    accepted = "must be 1-64 lowercase letters, digits, '.', '_' or '-'"
    found = problems(error)
    assert set(found) == {f"{path}: name", f"{path}: backends[0].id", f"{path}: peers[0].id"}
    assert found[f"{path}: name"] == f"{accepted}, got 'Marin'"
    assert found[f"{path}: backends[0].id"] == f"{accepted}, got 'has space'"
    assert all(message.startswith(accepted) for message in found.values())


def test_unknown_fields_are_named_with_the_accepted_ones(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "unknown.yaml",
        "name: marin\ncolour: red\nplacement: {tick: 3}\nbackends: [{id: cpu, kind: process, gpus: 2}]\n",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    found = problems(error)
    assert set(found) == {str(path), f"{path}: placement", f"{path}: backends[0]"}
    assert found[str(path)].startswith("unknown field(s) colour; accepted: name, default_region, state_dir, placement")
    assert "backends" in found[str(path)] and "peers" in found[str(path)]
    assert found[f"{path}: placement"] == (
        "unknown field(s) tick; accepted: tick_interval_seconds, sync_interval_seconds, max_handoffs_per_cycle, "
        "heartbeat_staleness_seconds, heartbeat_timeout_seconds, delivery_timeout_seconds, requeue_after_seconds, "
        "requeue_avoid_seconds, max_requeues, peer_lost_seconds, start_timeout_seconds, reserve_after_seconds"
    )
    assert found[f"{path}: backends[0]"] == (
        "unknown field(s) gpus; accepted: id, kind, devices, device_type, attributes, max_running_jobs, state_dir, env"
    )


def test_device_counts_and_limits_must_be_positive(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "counts.yaml",
        "name: marin\nbackends: [{id: gpu, kind: process, devices: {h100: -8, a100: 0}, max_running_jobs: 0}]\n"
        "placement: {tick_interval_seconds: 0, max_handoffs_per_cycle: -1, delivery_timeout_seconds: soon}\n",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    assert problems(error) == {
        f"{path}: backends[0].devices.h100": "must be >= 1",
        f"{path}: backends[0].devices.a100": "must be >= 1",
        f"{path}: backends[0].max_running_jobs": "must be >= 1",
        f"{path}: placement.tick_interval_seconds": "must be > 0.0",
        f"{path}: placement.max_handoffs_per_cycle": "must be >= 1",
        f"{path}: placement.delivery_timeout_seconds": "must be a number",
    }


def test_wrong_kinds_and_shapes_are_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "kinds.yaml",
        "name: marin\nbackends: [{id: slurm, kind: slurm}]\ndefault_region: [us]\n",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    found = problems(error)
    assert found[f"{path}: backends[0].kind"] == "must be one of: process, kubernetes"
    assert found[f"{path}: default_region"] == "must be a string"
    missing = write(tmp_path, "missing.yaml", "backends: []\n")
    with pytest.raises(SpecError) as error:
        load_cluster_config(missing)
    assert problems(error) == {f"{missing}: name": "is required"}


@pytest.mark.parametrize(
    ("name", "text", "kind"), [("bad.yaml", "name: marin\nbackends: [\n", "YAML"), ("bad.json", '{"name": ', "JSON")]
)
def test_a_file_that_does_not_parse_is_named_with_the_parser_error(
    tmp_path: Path, name: str, text: str, kind: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    [(where, message)] = problems(error).items()
    assert where == str(path)
    assert message.startswith(f"not valid {kind}: ")
    assert "line" in message  # where in the file it broke


@pytest.mark.parametrize("text", ["", "- just\n- a list\n", "just a string\n"])
def test_a_document_that_is_not_a_mapping_is_refused(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "odd.yaml", text)
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    assert problems(error) == {str(path): "must be an object"}


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(SpecError, match=f"^{path}: cannot read the cluster configuration: No such file or directory$"):
        load_cluster_config(path)


def test_the_parsed_configuration_is_frozen(tmp_path: Path) -> None:
    config = parse_cluster_config({"name": "marin"})
    assert isinstance(config, ClusterConfig)
    with pytest.raises(ValueError, match="frozen"):
        config.name = "other"  # type: ignore[misc]


def test_lost_peer_and_start_timeout_settings_are_checked(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "lifecycle.yaml",
        "name: marin\nplacement: {peer_lost_seconds: 0, start_timeout_seconds: -1}\n",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    found = problems(error)
    assert found[f"{path}: placement.peer_lost_seconds"] == "must be > 0.0"
    assert found[f"{path}: placement.start_timeout_seconds"] == "must be >= 0.0"
    off = write(tmp_path, "off.yaml", "name: marin\nplacement: {start_timeout_seconds: 0}\n")
    placement = load_cluster_config(off).placement
    assert (placement.start_timeout_seconds, placement.peer_lost_seconds) == (0, 900)


def test_holding_for_starving_jobs_is_on_after_half_an_hour_by_default_and_zero_turns_it_off(tmp_path: Path) -> None:
    from iris_airflow_provider.services.federation import Federation
    from iris_airflow_provider.store.store import FederationStore

    default = load_cluster_config(write(tmp_path, "default.yaml", "name: marin\n"))
    assert default.placement.reserve_after_seconds == 1800
    store = FederationStore.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    try:
        assert Federation(default, store, backends={}, peers={}).placement_rules.reserve_after_ms == 1_800_000
        off = load_cluster_config(write(tmp_path, "off.yaml", "name: marin\nplacement: {reserve_after_seconds: 0}\n"))
        assert Federation(off, store, backends={}, peers={}).placement_rules.reserve_after_ms is None
    finally:
        store.dispose()
    path = write(tmp_path, "bad.yaml", "name: marin\nplacement: {reserve_after_seconds: -5}\n")
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    assert problems(error) == {f"{path}: placement.reserve_after_seconds": "must be >= 0.0"}


def test_a_trusted_peer_has_one_key_or_two_while_it_rotates(tmp_path: Path) -> None:
    keys = [generate_keypair()[1] for _ in range(3)]
    one = parse_cluster_config({"name": "cw-east", "federation": {"trusted_peers": {"marin": {"public_key": keys[0]}}}})
    two = parse_cluster_config(
        {"name": "cw-east", "federation": {"trusted_peers": {"marin": {"public_key": keys[:2]}}}}
    )
    assert one.federation.trusted_peers["marin"].public_keys() == keys[:1]
    assert two.federation.trusted_peers["marin"].public_keys() == keys[:2]
    with pytest.raises(SpecError) as error:
        parse_cluster_config(
            {"name": "cw-east", "federation": {"trusted_peers": {"marin": {"public_key": keys}}}}, source="c.yaml"
        )
    assert problems(error) == {
        "c.yaml: federation.trusted_peers.marin.public_key": "give 1 or 2 keys (the current and, during a rotation, "
        "the next), got 3"
    }


def test_bundle_retention_settings_are_bounded_and_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "bundles.yaml",
        "name: marin\nbundles: {keep_unused_seconds: 10, keep_partial_seconds: 0, max_total_bytes: 0}\n",
    )
    with pytest.raises(SpecError) as error:
        load_cluster_config(path)
    found = problems(error)
    assert found[f"{path}: bundles.keep_unused_seconds"] == "must be >= 300.0"
    assert found[f"{path}: bundles.keep_partial_seconds"] == "must be >= 60.0"
    assert found[f"{path}: bundles.max_total_bytes"] == "must be >= 1"
    small = write(tmp_path, "small.yaml", "name: marin\nbundles: {max_bundle_bytes: 2000, max_total_bytes: 1000}\n")
    with pytest.raises(SpecError) as error:
        load_cluster_config(small)
    (message,) = problems(error).values()
    assert "bundles.max_total_bytes (1000) must be at least bundles.max_bundle_bytes (2000)" in message
    rules = load_cluster_config(write(tmp_path, "default.yaml", "name: marin\n")).bundles.retention
    assert (rules.keep_unused_ms, rules.keep_partial_ms, rules.max_total_bytes) == (86_400_000, 3_600_000, 50 * 2**30)
