"""The provider's Airflow plugin: the peer API other clusters call, the Federation page and its
JSON API, served by the api-server.
"""
