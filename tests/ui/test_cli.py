"""``airflow iris-federation list-peers | jobs | describe | explain | cancel | simulate | keygen`` against a
real store and cluster file: the real ``airflow`` command as a subprocess for each ``--output`` format,
and Airflow's own CLI parser in process for the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import JobState
from tests.ui.conftest import CLEANUP, EVAL, RECEIVED, TRAIN

AIRFLOW = Path(sys.executable).parent / "airflow"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def airflow_env(federation, tmp_path: Path) -> dict[str, str]:
    """A user's deployment: its own AIRFLOW_HOME, the store as the Airflow connection, the cluster file in
    the configuration (and not the test session's unit-test mode, whose banner Airflow prints at import)."""
    conn = json.dumps({"conn_type": "irisfederation", "host": federation.store.url})
    home = tmp_path / "airflow-home"
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT": conn,
        "AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG": str(tmp_path / "cluster.yaml"),
    }


def airflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AIRFLOW), "iris-federation", *args], env=env, capture_output=True, text=True, timeout=180, check=False
    )


@pytest.fixture
def cli(federation, tmp_path: Path, capsys):
    """``airflow iris-federation ARGS`` through Airflow's CLI parser in this process: (exit code, stdout)."""
    from airflow.cli import cli_parser

    parser = cli_parser.get_parser()
    options = ["--store-url", federation.store.url, "--cluster-config", str(tmp_path / "cluster.yaml")]

    def run(*args: str, store: bool = True) -> tuple[int, str]:
        capsys.readouterr()
        parsed = parser.parse_args(["iris-federation", *args, *(options if store else [])])
        try:
            parsed.func(parsed)
            code = 0
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else 1
            if isinstance(exited.code, str):
                print(exited.code, file=sys.stderr)
        return code, capsys.readouterr().out

    return run


def table_rows(out: str) -> list[list[str]]:
    """The cells of a ``--output table`` table (rich's ``|``-separated rows, the ``=`` rule left out)."""
    return [[cell.strip() for cell in line.split("|")] for line in out.splitlines() if "|" in line]


@pytest.mark.parametrize("output", ["table", "json", "yaml", "plain"])
def test_airflow_iris_federation_jobs_in_every_output_format(airflow_env, output):
    done = airflow(airflow_env, "jobs", "--output", output)
    assert done.returncode == 0, done.stderr
    order = [RECEIVED, CLEANUP, EVAL, TRAIN]
    if output == "json":
        document = json.loads(done.stdout)  # standard output holds the document alone: no log lines
        assert [job["job_id"] for job in document["jobs"]] == order and document["total"] == 4
        assert document["jobs"][3]["age_ms"] >= 0  # numbers stay numbers
    elif output == "yaml":
        document = yaml.safe_load(done.stdout)
        assert [job["job_id"] for job in document["jobs"]] == order and document["limit"] == 50
    elif output == "table":
        header, *rows = table_rows(done.stdout)
        assert header[:4] == ["job", "state", "handoff", "peer"]
        assert [row[0] for row in rows] == order
        assert rows[3][-1] == reasons.QUEUED_UNPINNED
        assert done.stdout.rstrip().endswith("1-4 of 4 job(s)")
    else:
        lines = done.stdout.splitlines()
        assert lines[0].split()[:4] == ["job", "state", "handoff", "peer"]
        assert [line.split()[0] for line in lines[1:5]] == order
        assert lines[4].endswith(reasons.QUEUED_UNPINNED)


def test_airflow_iris_federation_list_peers_json_is_the_list_peers_shape(airflow_env):
    done = airflow(airflow_env, "list-peers", "-o", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    h100 = next(peer for peer in document["peers"] if peer["peer_id"] == "cw-h100")
    assert set(h100) >= {"peer_id", "controller_address", "reachable", "last_contact_ms", "active_federated_jobs"}
    (backend,) = h100["backends"]
    assert backend["advertised_attributes"]["device-type"] == {"values": ["gpu"]}
    assert backend["availability"]["amounts"] == {"h100": 8}
    assert set(backend) >= {"pending_task_count", "running_task_count"}


def test_an_unknown_job_exits_1_naming_it(airflow_env):
    done = airflow(airflow_env, "describe", "/nobody/x")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "airflow iris-federation describe: job /nobody/x not found" in done.stderr


def test_list_peers_tables_with_meters_and_the_fleet(cli):
    code, out = cli("list-peers")
    assert code == 0
    assert out.startswith("Peers of marin:\n")
    h100 = next(row for row in table_rows(out) if row[0] == "cw-h100")
    assert h100[:3] == ["cw-h100", "agentless", "yes"] and h100[-1] == "h100 8/8 free"
    assert "Fleet (local + reachable peers), free/total: gb200 4/4, h100 8/8" in out
    code, out = cli("list-peers", "-o", "plain")
    assert "Local backends of marin:" in out
    assert any(line.split()[:2] == ["cw-h100", "agentless"] for line in out.splitlines())


def test_jobs_filters_and_pages(cli):
    code, out = cli("jobs", "--submitter", "bob", "-o", "json")
    document = json.loads(out)
    assert [job["job_id"] for job in document["jobs"]] == [EVAL] and document["total"] == 1
    code, out = cli("jobs", "--limit", "1", "--offset", "1")
    assert code == 0
    assert out.rstrip().splitlines()[-1] == "2-2 of 4 job(s) (--offset 2 for more)"


def test_describe_and_explain_a_queued_job(cli):
    code, out = cli("describe", TRAIN)
    assert code == 0
    assert ["why", reasons.QUEUED_UNPINNED] in table_rows(out)
    assert "History:" in out and "admitted" in out
    code, out = cli("describe", TRAIN, "-o", "yaml")
    assert yaml.safe_load(out)["pending_reason"] == reasons.QUEUED_UNPINNED
    code, out = cli("explain", TRAIN, "-o", "json")
    explained = json.loads(out)
    assert explained["status"] == "never_fits" and explained["explanation"]["gate"] == {"h100": 16}
    code, out = cli("explain", TRAIN)
    assert next(r for r in table_rows(out) if r[0] == "cw-h100")[:4] == ["cw-h100", "ok", "default", "matches"]
    assert "No reachable backend can ever hold it" in out and "cw-h100/default with 8 in total" in out


def test_describe_shows_a_jobs_tree(cli, federation):
    from iris_airflow_provider.core.model import parse_job
    from iris_airflow_provider.core.states import Direction
    from iris_airflow_provider.store.records import NewIncarnation

    parent = federation.store.get_job(CLEANUP)
    child = NewIncarnation(parse_job({"job_id": f"{CLEANUP}/shard-0"}), Direction.LOCAL, "script")
    federation.store.admit_child(child, CLEANUP, parent.nonce, 1)
    code, out = cli("describe", CLEANUP)
    assert code == 0 and "Children (its tree runs on one cluster):" in out
    assert next(row for row in table_rows(out) if row[0] == f"{CLEANUP}/shard-0")[1] == "pending"
    code, out = cli("describe", CLEANUP, "-o", "json")
    assert [c["job_id"] for c in json.loads(out)["children"]] == [f"{CLEANUP}/shard-0"]


def test_cancel_then_cancel_again_exits_1(cli, federation):
    code, out = cli("cancel", TRAIN, "-o", "plain")
    assert code == 0
    assert out.splitlines()[1].split(None, 2) == [TRAIN, "cancelled", reasons.CANCELLED_BEFORE_HANDOFF]
    assert federation.store.get_job(TRAIN).state is JobState.KILLED
    code, out = cli("cancel", TRAIN, "-o", "json")
    assert code == 1 and json.loads(out)["result"] == "already_finished"


def test_bad_arguments_exit_2_naming_the_rule(cli, capsys):
    for args, message in (
        (("jobs", "--state", "stuck"), "invalid choice: 'stuck'"),
        (("jobs", "--limit", "0"), "--limit must be between 1 and 10000, got 0"),
        (("describe", "/../.."), "JOB must look like /<user>/<name>"),
    ):
        with pytest.raises(SystemExit) as exited:
            cli(*args)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err


def test_simulate_and_keygen_under_airflow(cli, tmp_path):
    code, out = cli("simulate", str(EXAMPLES / "simulate-capacity.json"), "-o", "json", store=False)
    assert code == 0
    assert [d["disposition"] for d in json.loads(out)["decisions"]] == ["queue", "queue", "reject", "queue"]
    code, out = cli("simulate", str(EXAMPLES / "simulate-capacity.json"), store=False)
    assert ["/alice/big", "cw-h100", "default", "32 h100"] in table_rows(out)
    code, out = cli("keygen", "--name", "marin", "--out-dir", str(tmp_path / "keys"), store=False)
    assert code == 0 and (tmp_path / "keys" / "marin.key").stat().st_mode & 0o777 == 0o600
    assert "federation.trusted_peers.marin.public_key" in out


def test_the_standalone_command_runs_simulate_and_keygen_without_airflow(tmp_path):
    """No Airflow configuration, no AIRFLOW_HOME: the offline commands never import Airflow."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    script = (
        "import sys; from iris_airflow_provider.cli import main\n"
        f"code = main(['simulate', {str(EXAMPLES / 'simulate-capacity.json')!r}, '--compact'])\n"
        f"code += main(['keygen', '--name', 'east', '--out-dir', {str(tmp_path / 'keys')!r}])\n"
        "assert 'airflow' not in sys.modules, 'the stand-alone command imported Airflow'\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["decisions"][2]["disposition"] == "reject"
    assert (tmp_path / "keys" / "east.pub").exists()
    assert list(home.iterdir()) == []  # no ~/airflow/airflow.cfg written
    moved = subprocess.run(
        [str(Path(sys.executable).parent / "iris-federation"), "jobs"], env=env, capture_output=True, text=True
    )
    assert moved.returncode == 2 and "run it as `airflow iris-federation jobs ...`" in moved.stderr
