"""Backends: where a cluster runs the jobs it owns (its local jobs and the handoffs it accepted).
They do I/O and translate; the decisions they carry out come from the core.
"""
