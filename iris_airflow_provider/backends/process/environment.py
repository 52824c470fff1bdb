"""The environment a process backend starts a job's replica with: a clean base, the backend's
defaults, the rendezvous on loopback, the job's own env, then what says which job, replica and devices
this is (``CUDA_VISIBLE_DEVICES`` the replica's GPU slots), which the job cannot override."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from iris_airflow_provider.backends.base import (
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    RANK_ENV,
    job_identity_env,
    rendezvous_env,
)
from iris_airflow_provider.backends.process import processes
from iris_airflow_provider.backends.process.state import BackendSettings, JobFile, read_job_token, result_file_name
from iris_airflow_provider.core.job_result import RESULT_ENV
from iris_airflow_provider.core.serving import port_env


def replica_environment(
    job: JobFile,
    replica: int,
    devices: Mapping[str, list[int]],
    coordinator_port: int,
    ports: Mapping[str, int] | None,
    settings: BackendSettings,
    directory: Path,
) -> dict[str, str]:
    """A replica's environment: a clean base, the backend's defaults, the rendezvous on loopback
    (replica 0 listens on ``coordinator_port``, one the supervisor found free for this run), the
    job's own env (it wins over those: a job may pick its own ``MASTER_PORT``), then what says
    which job, replica and devices this is, which nothing overrides: a job that set them could
    pass for another or use devices it was not given (the job model refuses ``IRIS_*`` names in a
    job's env; ``CUDA_VISIBLE_DEVICES`` is the slots)."""
    env = processes.base_environment()
    env.update(settings.env)
    env.update(rendezvous_env("127.0.0.1", coordinator_port, job.replicas))
    env.update(dict.fromkeys(RANK_ENV, str(replica)))
    env.update(job.env)
    env.update(job_identity_env(job.spec["job_id"], job.nonce, job.replicas, settings.backend_id))
    env["IRIS_COORDINATOR_ADDRESS"] = f"127.0.0.1:{coordinator_port}"
    env["IRIS_REPLICA_INDEX"] = str(replica)
    env[RESULT_ENV] = str(directory / result_file_name(replica))
    if job.job_env:  # its way back to this cluster: the URL, and a token renewed in a file
        env.update(job.job_env)
        token_file, token = read_job_token(directory)
        env[JOB_TOKEN_FILE_ENV] = str(token_file)
        env[JOB_TOKEN_ENV] = token
    env.update(port_env(dict(ports or {})))  # IRIS_PORT_<NAME>: this replica's own, free on loopback
    per_replica = job.devices_per_replica
    if settings.device_type == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # unset would mean every GPU of the machine
    for variant, slots in devices.items():
        mine = slots[replica * per_replica : (replica + 1) * per_replica]
        env["IRIS_DEVICE_VARIANT"] = variant
        if settings.device_type == "gpu":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in mine)
        env["IRIS_DEVICE_SLOTS"] = ",".join(str(s) for s in mine)
    return env
