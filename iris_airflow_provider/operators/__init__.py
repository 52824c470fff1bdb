"""Populated by the Airflow surface (operator, sensor, trigger, placement DAG)."""
