"""This cluster: its configuration file and the objects built from it."""
