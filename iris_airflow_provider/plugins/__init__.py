"""The provider's Airflow plugin: HTTP apps served by the api-server (peer API, later the UI)."""
