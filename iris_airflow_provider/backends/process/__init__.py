"""The ``process`` backend: jobs as local subprocesses on declared device slots (see ``backend.py``).

Modules: ``backend`` (the ``ProcessBackend``), ``state`` (the state directory and its typed files),
``processes`` (launching and watching OS processes), ``supervisor`` (the detached process that runs
one job), ``logs`` (reading a job's output), ``report`` (its files as a ``JobReport``), ``config``.
"""
