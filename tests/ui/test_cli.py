"""``iris-federation list-peers | jobs | describe | explain | cancel`` against a real store and cluster file."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from iris_airflow_provider.cli import main
from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import JobState
from tests.ui.conftest import CLEANUP, EVAL, RECEIVED, TRAIN


@pytest.fixture
def cli(federation, tmp_path: Path):
    options = ["--store-url", federation.store.url, "--cluster-config", str(tmp_path / "cluster.yaml")]

    def run(*args: str) -> tuple[int, str]:
        out = io.StringIO()
        code = main([*args, *options], stdout=out)
        return code, out.getvalue()

    return run


def test_list_peers_json_is_the_list_peers_shape(cli):
    code, out = cli("list-peers", "--json")
    document = json.loads(out)
    assert code == 0
    h100 = next(peer for peer in document["peers"] if peer["peer_id"] == "cw-h100")
    assert set(h100) >= {"peer_id", "controller_address", "reachable", "last_contact_ms", "active_federated_jobs"}
    (backend,) = h100["backends"]
    assert backend["advertised_attributes"]["device-type"] == {"values": ["gpu"]}
    assert backend["availability"]["amounts"] == {"h100": 8}
    assert set(backend) >= {"pending_task_count", "running_task_count"}


def test_list_peers_prints_a_table_with_meters_and_the_fleet(cli):
    code, out = cli("list-peers")
    assert code == 0
    assert out.startswith("Peers of marin:\nPEER ")
    assert "cw-h100   agentless  yes" in out and "h100 8/8 free" in out
    assert "Fleet (local + reachable peers), free/total: gb200 4/4, h100 8/8" in out


def test_jobs_lists_with_filters_and_json(cli):
    code, out = cli("jobs")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:4] == ["JOB", "STATE", "HANDOFF", "PEER"]
    assert [line.split()[0] for line in lines[1:5]] == [RECEIVED, CLEANUP, EVAL, TRAIN]
    assert lines[4].endswith(reasons.QUEUED_UNPINNED)
    assert lines[-1] == "1-4 of 4 job(s)"
    code, out = cli("jobs", "--submitter", "bob", "--json")
    document = json.loads(out)
    assert [job["job_id"] for job in document["jobs"]] == [EVAL] and document["total"] == 1
    code, out = cli("jobs", "--limit", "1", "--offset", "1")
    assert out.splitlines()[-1] == "2-2 of 4 job(s) (--offset 2 for more)"


def test_describe_and_explain_a_queued_job(cli):
    code, out = cli("describe", TRAIN)
    assert code == 0
    assert f"why           {reasons.QUEUED_UNPINNED}" in out
    assert "History:" in out and "admitted" in out
    code, out = cli("explain", TRAIN, "--json")
    explained = json.loads(out)
    assert explained["status"] == "never_fits" and explained["explanation"]["gate"] == {"h100": 16}
    code, out = cli("explain", TRAIN)
    assert "cw-h100   ok      default  matches" in out
    assert "No reachable backend can ever hold it" in out and "cw-h100/default with 8 in total" in out


def test_cancel_then_cancel_again(cli, federation):
    code, out = cli("cancel", TRAIN)
    assert (code, out) == (0, f"{TRAIN}: cancelled: {reasons.CANCELLED_BEFORE_HANDOFF}\n")
    assert federation.store.get_job(TRAIN).state is JobState.KILLED
    code, out = cli("cancel", TRAIN, "--json")
    assert code == 1 and json.loads(out)["result"] == "already_finished"


def test_an_unknown_job_exits_1_and_bad_arguments_exit_2(cli, capsys):
    assert cli("describe", "/nobody/x") == (1, "")
    assert "iris-federation describe: job /nobody/x not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli("jobs", "--state", "stuck")
    assert exited.value.code == 2
    with pytest.raises(SystemExit) as exited:
        cli("jobs", "--limit", "0")
    assert exited.value.code == 2
    assert "--limit must be between 1 and 10000, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["describe", "explain", "cancel"])
def test_a_job_id_the_rule_refuses_exits_2_stating_the_rule(cli, capsys, command):
    with pytest.raises(SystemExit) as exited:
        cli(command, "/../..")
    assert exited.value.code == 2
    assert "JOB must look like /<user>/<name>" in capsys.readouterr().err


def test_the_installed_command_prints_only_json_on_standard_output(federation, tmp_path):
    """Airflow logs to standard output; ``--json`` must keep it for the document alone."""
    command = [
        str(Path(sys.executable).parent / "iris-federation"),
        "jobs",
        "--json",
        "--store-url",
        federation.store.url,
        "--cluster-config",
        str(tmp_path / "cluster.yaml"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total"] == 4
