"""A real Airflow deployment on loopback, for the live demo and the end-to-end tests.

The four components run as separate processes (api-server, scheduler, dag-processor, triggerer;
not ``airflow standalone``, which does not stop cleanly), each in its own session, with their
own ``AIRFLOW_HOME``, port, metadata database and federation store, so several deployments can
run side by side. It talks to them only the way a user would: the REST API with a token.

Users sign in through Airflow's SimpleAuthManager by default (roles viewer, user, op, admin, on
every DAG alike). ``auth_manager="fab"`` runs the FAB auth manager instead (the
``apache-airflow-providers-fab`` package), whose roles can grant permissions on single DAGs: the
same users get FAB's built-in roles, and :meth:`AirflowDeployment.create_role` and
:meth:`AirflowDeployment.create_user` add more through FAB's own REST API.

``executor="celery"`` runs the CeleryExecutor with a ``celery worker`` (Redis as the broker, the
metadata database as the result backend), and ``instances`` runs several schedulers, triggerers or
api-servers, as a highly available deployment does: the first instance of a component is named
after it (``scheduler``), the others ``scheduler.2`` and so on, each with its own log, and each
can be stopped or killed alone. Api-server instances listen on ``api_ports`` (the first on ``port``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from cryptography.fernet import Fernet

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
CELERY_WORKER = "celery-worker"  # `airflow celery worker`, with executor="celery"
USERS = {"admin": "admin", "alice": "user", "bob": "user", "viewer": "viewer"}
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
FAB_ROLES = {"admin": "Admin", "user": "User", "op": "Op", "viewer": "Viewer"}  # FAB's built-in roles
TERMINAL_RUN_STATES = ("success", "failed")
DAGS_FOLDER_BUNDLE = {
    "name": "dags-folder",
    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
    "kwargs": {},
}
# Notice a killed worker (its task's heartbeat stops) and a dead scheduler's orphaned tasks in
# seconds, not minutes. A live scheduler counts as dead once its heartbeat is older than the
# threshold: 30 s (Airflow's default), not less, or a busy machine makes it reset its own tasks.
FAST_FAILURE_DETECTION = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
}
# The demo on a busy two-core machine: nothing is killed on purpose, so nothing needs noticing fast.
PATIENT_FAILURE_DETECTION = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "300",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "300",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "120",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "120",
}


class DeploymentError(RuntimeError):
    pass


@dataclass
class AirflowDeployment:
    home: Path
    port: int
    metadata_url: str  # SQLAlchemy URL of Airflow's own database
    store_url: str  # the federation store (never the metadata database)
    cluster_config: Path | None = None
    dags_folder: Path = REPO / "dags"
    extra_env: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)  # Airflow Variables set before anything starts
    parallelism: int = 4
    # Tests kill workers and schedulers on purpose and want Airflow to notice in seconds. The demo
    # does not: on a busy machine, a scheduler whose own heartbeat lags past a short threshold
    # declares itself dead and resets its running tasks, so it keeps Airflow's patient defaults.
    fast_failure_detection: bool = True
    passwords: dict[str, str] = field(default_factory=dict)  # default: "<user>-password"
    auth_manager: Literal["simple", "fab"] = "simple"
    components: tuple[str, ...] = COMPONENTS  # ("api-server",) alone serves the UI and REST API
    executor: Literal["local", "celery"] = "local"
    # The Celery broker, e.g. redis://127.0.0.1:6379/3 (a database number of its own per deployment).
    celery_broker_url: str | None = None
    celery_concurrency: int = 4
    instances: dict[str, int] = field(default_factory=dict)  # component -> how many (default 1)
    api_ports: tuple[int, ...] = ()  # the api-server instances after the first, which listens on `port`
    # Where workers and triggerers reach the Execution API: with several api-servers, a load
    # balancer in front of them (default: the first api-server, `base_url`).
    execution_api_url: str | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _tokens: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def password(self, user: str) -> str:
        return self.passwords.get(user, f"{user}-password")

    def env(self) -> dict[str, str]:
        from iris_airflow_provider.cli.offline import merge_bundle_config

        env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor" if self.executor == "celery" else "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
            # Airflow's default dags folder plus the provider's bundle, whatever this process's configuration.
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(merge_bundle_config([DAGS_FOLDER_BUNDLE])),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",  # a new DAG file is parsed within 5 s
            # The DAG files of the tests and the demo do not change while a deployment runs: each is
            # parsed once, instead of again every few seconds, the dag-processor's main CPU cost.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt"),
            "AIRFLOW__API__SECRET_KEY": self._secret("api"),
            # One key for every component: the dag-processor encrypts trigger kwargs the triggerer reads.
            "AIRFLOW__CORE__FERNET_KEY": self._secret("fernet", Fernet.generate_key().decode()),
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            "AIRFLOW__TRIGGERER__CAPACITY": "1000",
            # Deferrable operators (ours too, unless [iris_federation] default_deferrable says otherwise)
            # wait in the triggerer: what a deployment running a triggerer sets.
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            "AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT": json.dumps({"conn_type": "irisfederation", "host": self.store_url}),
            "PYTHONUNBUFFERED": "1",
        }
        if self.auth_manager == "fab":
            env["AIRFLOW__CORE__AUTH_MANAGER"] = FAB_AUTH_MANAGER
        if self.executor == "celery":
            if not self.celery_broker_url:
                raise DeploymentError("executor='celery' needs celery_broker_url (e.g. redis://127.0.0.1:6379/1)")
            env["AIRFLOW__CELERY__BROKER_URL"] = self.celery_broker_url
            # Task results in the metadata database (Celery's SQLAlchemy backend), not in the broker.
            env["AIRFLOW__CELERY__RESULT_BACKEND"] = "db+" + self.metadata_url
            env["AIRFLOW__CELERY__WORKER_CONCURRENCY"] = str(self.celery_concurrency)
        if self.execution_api_url:
            env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = self.execution_api_url
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if self.fast_failure_detection:
            env.update(FAST_FAILURE_DETECTION)
        else:
            env.update(PATIENT_FAILURE_DETECTION)
        if self.cluster_config is not None:
            env["AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG"] = str(self.cluster_config)
        env.update(self.extra_env)
        return env

    def _secret(self, name: str, value: str | None = None) -> str:
        path = self.home / f".{name}-secret"
        if not path.exists():
            path.write_text(value or secrets.token_urlsafe(32))
        return path.read_text()

    # Lifecycle ----------------------------------------------------------------------------------

    def start(self, timeout: float = 180) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({u: self.password(u) for u in USERS}))
        migrate = subprocess.run(
            [str(VENV_BIN / "airflow"), "db", "migrate"], env=self.env(), capture_output=True, text=True
        )
        if migrate.returncode != 0:
            raise DeploymentError(f"airflow db migrate failed:\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}")
        if self.auth_manager == "fab":
            self._airflow("users", "create", *_fab_user_args("admin", self.password("admin"), "Admin"))
        for name, value in self.variables.items():  # in the metadata database, as `airflow variables set` puts them
            self._airflow("variables", "set", name, value)
        for instance in self.instance_names():
            self.start_component(instance)
        self.wait_healthy(timeout)
        if self.auth_manager == "fab":
            for user, role in USERS.items():
                if user != "admin":
                    self.create_user(user, [FAB_ROLES[role]])

    def _airflow(self, *args: str) -> str:
        done = subprocess.run([str(VENV_BIN / "airflow"), *args], env=self.env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise DeploymentError(f"airflow {args[0]} {args[1]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def instance_names(self) -> list[str]:
        """Every process this deployment runs: each component's instances, then the Celery worker."""
        names = []
        for component in self.components:
            count = self.instances.get(component, 1)
            names += [component] + [f"{component}.{n}" for n in range(2, count + 1)]
        if self.executor == "celery":
            names.append(CELERY_WORKER)
        return names

    def api_urls(self) -> list[str]:
        """Every api-server instance's address, the first (``base_url``) first."""
        return [self.base_url] + [f"http://127.0.0.1:{port}" for port in self.api_ports]

    def start_component(self, component: str) -> None:
        """Start a component, or one instance of it (``scheduler.2``, ``api-server.2``)."""
        kind, _, number = component.partition(".")
        if kind == CELERY_WORKER:
            args = [str(VENV_BIN / "airflow"), "celery", "worker", "--skip-serve-logs", "--without-gossip"]
        else:
            args = [str(VENV_BIN / "airflow"), kind]
        if kind in ("scheduler", "triggerer"):
            args.append("--skip-serve-logs")  # no fixed ports: deployments can run side by side
        if kind == "api-server" and number:
            ports = (self.port, *self.api_ports)
            if int(number) > len(ports):
                raise DeploymentError(f"{component} has no port: give api_ports one per api-server after the first")
            args += ["--port", str(ports[int(number) - 1])]
        log = self.log_path(component).open("ab")
        self.processes[component] = subprocess.Popen(
            args, env=self.env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )

    # FAB users and roles (auth_manager="fab") --------------------------------------------------

    def create_role(self, name: str, permissions: Iterable[tuple[str, str]]) -> None:
        """A FAB role granting ``(action, resource)`` pairs, e.g. ``("can_read", "DAG:train")``,
        through FAB's REST API (``POST /auth/fab/v1/roles``) as admin. A DAG's resources
        (``DAG:<id>``, ``DAG Run:<id>``) exist once the dag-processor has parsed it."""
        body = {
            "name": name,
            "actions": [
                {"action": {"name": action}, "resource": {"name": resource}} for action, resource in permissions
            ],
        }
        response = self.api("POST", "/auth/fab/v1/roles", json=body, timeout=120)
        if response.status_code not in (200, 201):
            raise DeploymentError(f"creating role {name} failed: {response.status_code} {response.text}")

    def create_user(self, user: str, roles: Sequence[str]) -> None:
        """A FAB user with ``roles`` and the deployment's password for it (``POST /auth/fab/v1/users``)."""
        body = {
            "username": user,
            "email": f"{user}@example.com",
            "first_name": user,
            "last_name": "Example",
            "roles": [{"name": role} for role in roles],
            "password": self.password(user),
        }
        response = self.api("POST", "/auth/fab/v1/users", json=body, timeout=120)  # hashes the password
        if response.status_code not in (200, 201):
            raise DeploymentError(f"creating user {user} failed: {response.status_code} {response.text}")

    def stop_component(self, component: str, timeout: float = 30) -> None:
        process = self.processes.pop(component, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # the main process only: it stops its own children
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def kill_component(self, component: str, *, descendants: bool = True) -> None:
        """SIGKILL the component and everything it started (its workers too): a crash, not a stop.

        Task processes run in process groups of their own, so the component's group is not enough:
        a task left running holds the connections it inherited from the scheduler, and with them
        the dead scheduler's open transaction and its row locks, which the next scheduler then skips.
        ``descendants=False`` kills the component's process group alone, so what it started in a
        session of its own survives (a job supervisor the process backend detached, which a crash
        of the api-server process alone would not take down).
        """
        process = self.processes.pop(component)
        started = _descendants(process.pid) if descendants else []
        os.killpg(process.pid, signal.SIGKILL)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(10)

    def stop(self, timeout: float = 30) -> None:
        """Stop every process: all but the api-servers at once (each takes seconds to wind down,
        so one after the other adds up), then the api-servers, which the others may still be
        reporting to while they stop. Whatever is still running after ``timeout`` is killed."""
        names = list(self.processes)
        api_servers = [name for name in names if name.partition(".")[0] == "api-server"]
        for group in ([name for name in names if name not in api_servers], api_servers):
            self._stop_together(group, timeout)

    def _stop_together(self, components: Sequence[str], timeout: float) -> None:
        running = {name: process for name in components if (process := self.processes.pop(name)).poll() is None}
        for process in running.values():
            process.send_signal(signal.SIGTERM)  # the main process only: it stops its own children
        deadline = time.monotonic() + timeout
        for process in running.values():
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for component, process in self.processes.items():
                if process.poll() is not None:
                    raise DeploymentError(
                        f"{component} exited with {process.returncode}; see {self.log_path(component)}"
                    )
            try:
                for url in self._running_api_urls():  # every api-server instance answers
                    last = httpx.get(f"{url}/api/v2/monitor/health", timeout=5).json()
                started = [
                    c.replace("-", "_") for c in self.components if c in ("scheduler", "dag-processor", "triggerer")
                ]
                statuses = [last.get(name, {}).get("status") for name in ("metadatabase", *started)]
                if all(status == "healthy" for status in statuses):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise DeploymentError(f"Airflow at {self.base_url} not healthy after {timeout:.0f} s: {last}")

    def _running_api_urls(self) -> list[str]:
        urls = self.api_urls()
        running = [name for name in self.processes if name.partition(".")[0] == "api-server"]
        return [urls[int(name.partition(".")[2] or 1) - 1] for name in running] or [self.base_url]

    def log_path(self, component: str) -> Path:
        return self.home / "logs" / f"{component}.log"

    # REST API -----------------------------------------------------------------------------------

    def token(self, user: str = "admin") -> str:
        if user not in self._tokens:
            response = httpx.post(
                f"{self.base_url}/auth/token", json={"username": user, "password": self.password(user)}, timeout=60
            )
            response.raise_for_status()
            self._tokens[user] = response.json()["access_token"]
        return self._tokens[user]

    def api(
        self, method: str, path: str, *, user: str = "admin", via: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        """A REST call as ``user``, to the first api-server or to the one at ``via`` (any instance
        accepts the token: they share the JWT secret)."""
        headers = {"Authorization": f"Bearer {self.token(user)}", **kwargs.pop("headers", {})}
        return httpx.request(
            method, f"{via or self.base_url}{path}", headers=headers, timeout=kwargs.pop("timeout", 90), **kwargs
        )

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.api("GET", f"/api/v2/dags/{dag_id}").status_code == 200:
                return
            time.sleep(0.5)
        raise DeploymentError(
            f"DAG {dag_id} did not appear within {timeout:.0f} s; see {self.log_path('dag-processor')}"
        )

    def trigger(
        self, dag_id: str, conf: dict[str, Any] | None = None, *, user: str = "admin", via: str | None = None
    ) -> str:
        response = self.api(
            "POST",
            f"/api/v2/dags/{dag_id}/dagRuns",
            user=user,
            via=via,
            json={"logical_date": None, "conf": conf or {}},
        )
        if response.status_code != 200:
            raise DeploymentError(f"triggering {dag_id} failed: {response.status_code} {response.text}")
        return str(response.json()["dag_run_id"])

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{_quote(run_id)}")
        response.raise_for_status()
        return dict(response.json())

    def wait_for_run(
        self, dag_id: str, run_id: str, timeout: float = 180, states: tuple[str, ...] = TERMINAL_RUN_STATES
    ) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run(dag_id, run_id)["state"]
            if state in states:
                return state
            time.sleep(0.5)
        raise DeploymentError(f"run {run_id} of {dag_id} still {state!r} after {timeout:.0f} s")

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        response = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{_quote(run_id)}/taskInstances/{task_id}")
        response.raise_for_status()
        return dict(response.json())

    def wait_for_task_state(
        self, dag_id: str, run_id: str, task_id: str, states: tuple[str, ...], timeout: float = 120
    ) -> str:
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.task_instance(dag_id, run_id, task_id).get("state")
            if state in states:
                return str(state)
            time.sleep(0.5)
        raise DeploymentError(f"task {task_id} of {run_id} still {state!r} after {timeout:.0f} s")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        response = self.api(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{_quote(run_id)}/taskInstances/{task_id}/logs/{try_number}"
        )
        response.raise_for_status()
        lines = []
        for line in response.json().get("content", []):
            if not isinstance(line, dict):
                lines.append(str(line))
                continue
            lines.append(str(line.get("event", "")))
            for detail in line.get("error_detail") or []:  # the exception, as the UI shows it
                lines.append(f"{detail.get('exc_type')}: {detail.get('exc_value')}")
        return "\n".join(lines)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        response = self.api(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{_quote(run_id)}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"deserialize": "true"},
        )
        response.raise_for_status()
        return response.json()["value"]

    def wait_for_tick(self, after_ms: int, timeout: float = 120) -> None:
        """Until a placement tick that started after ``after_ms`` (epoch ms) has finished."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self.api(
                "GET", "/api/v2/dags/iris_federation_tick/dagRuns", params={"order_by": "-start_date", "limit": 5}
            ).json()["dag_runs"]
            if any(run["state"] == "success" and _epoch_ms(run["start_date"]) > after_ms for run in runs):
                return
            time.sleep(0.5)
        raise DeploymentError(f"no placement tick finished within {timeout:.0f} s after {after_ms}")

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """What "Mark failed" (or success) on a task instance in the UI does."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{_quote(run_id)}/taskInstances/{task_id}"
        response = self.api("PATCH", path, json={"new_state": state})
        if response.status_code != 200:
            raise DeploymentError(
                f"marking {task_id} of {run_id} {state} failed: {response.status_code} {response.text}"
            )

    def clear_task(self, dag_id: str, run_id: str, task_id: str) -> None:
        """What "Clear" on a task instance in the UI does (running or deferred tasks too)."""
        body = {"dry_run": False, "dag_run_id": run_id, "task_ids": [task_id], "only_failed": False}
        response = self.api("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", json=body)
        if response.status_code != 200:
            raise DeploymentError(f"clearing {task_id} of {run_id} failed: {response.status_code} {response.text}")

    def worker_of(self, dag_id: str, run_id: str, task_id: str) -> tuple[int, int]:
        """(worker, task process) of a running task instance: the LocalExecutor worker supervises
        the task process it forked, whose pid the task instance records."""
        pid = self.task_instance(dag_id, run_id, task_id).get("pid")
        if not pid:
            raise DeploymentError(f"task {task_id} of {run_id} has no process")
        stat = Path(f"/proc/{pid}/stat").read_text()
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the fields after the command name: state, ppid
        return parent, int(pid)

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> None:
        response = self.api("PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{_quote(run_id)}", json={"state": state})
        if response.status_code != 200:
            raise DeploymentError(f"setting {run_id} to {state} failed: {response.status_code} {response.text}")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), whatever its process group."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _epoch_ms(timestamp: str | None) -> int:
    if not timestamp:
        return 0
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def _fab_user_args(user: str, password: str, role: str) -> list[str]:
    return [
        *("--username", user, "--password", password, "--role", role),
        *("--email", f"{user}@example.com", "--firstname", user, "--lastname", "Example"),
    ]


def _quote(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")
