"""Composition: the cluster file (this cluster's name, settings, local backends and peers) and the
one place the objects it describes are built.
"""
