"""The pure core: every scheduling and handoff rule of the federation lives here.

Classification at submit (and whether any backend could ever hold a job), placement on the tick,
what jobs in flight reserve, holds for starving jobs, expiry, what a failed
delivery leads to (retry, requeue, reject), when a waiting task counts as orphaned, grace periods,
band eviction on a backend, and the explanation of a pending job: each is a pure function of the
values passed in. Nothing here imports Airflow, a database, a network client or a process API, and
nothing reads the clock: time comes in as an argument. The layers above carry the decisions out.
"""
