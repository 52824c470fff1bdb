"""Apache Airflow provider that federates whole compute jobs across clusters.

The scheduling rules live in :mod:`iris_airflow_provider.core` (pure, no Airflow);
the federation state lives in :mod:`iris_airflow_provider.store`; everything else is a thin
Airflow surface over those two.
"""

__version__ = "0.1.0"
