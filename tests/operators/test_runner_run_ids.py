"""Every job id the rule accepts becomes a run id Airflow accepts for the runner DAG (issue 11: an id
holding '..' was admitted by a peer, which then could never create its run, and answered 503 for ever)."""

from __future__ import annotations

from airflow.models.dagrun import DagRun
from hypothesis import given
from hypothesis import strategies as st

from iris_airflow_provider.core.job_ids import derived_job_id, job_id_problem
from iris_airflow_provider.operators.runner_runs import runner_run_id

MAX_RUN_ID_LENGTH = 250  # Airflow's StringID column

job_ids = st.builds(derived_job_id, st.text(), st.text()) | st.from_regex(
    r"(/[A-Za-z0-9._:+@-]{1,40}){2,5}", fullmatch=True
).filter(lambda job_id: job_id_problem(job_id) is None)


@given(job_ids, st.text(st.characters(codec="ascii"), min_size=8, max_size=32))
def test_a_valid_job_id_always_makes_a_run_id_airflow_accepts(job_id: str, nonce: str) -> None:
    run_id = runner_run_id(job_id, nonce.encode().hex())
    assert DagRun.validate_run_id(None, "run_id", run_id) == run_id  # type: ignore[arg-type]
    assert len(run_id) <= MAX_RUN_ID_LENGTH
