"""Extra links from Airflow tasks to this provider's pages."""
