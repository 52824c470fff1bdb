"""DAG files shipped with the provider (load them with a DAG bundle; see the README)."""
