"""Backends: where a cluster runs the jobs it owns (its local jobs and the handoffs it accepted)."""
