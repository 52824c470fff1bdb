"""The ``kubernetes`` backend: a batch/v1 Job per job on a Kueue-run cluster (see ``backend.py``).

Modules: ``backend`` (the ``KubernetesBackend``), ``api`` (the calls to the API server),
``manifests`` (the Job and ConfigMap it creates), ``status`` (Job and pod status as a
``JobReport``), ``logs`` (the log cursor), ``capacity`` (capacity from nodes and pods), ``config``.
"""
