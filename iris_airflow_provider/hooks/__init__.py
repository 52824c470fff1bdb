"""Airflow hooks: how tasks, triggers and the plugin reach the federation store and this deployment's federation."""
