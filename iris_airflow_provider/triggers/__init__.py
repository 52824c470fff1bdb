"""Triggers: the deferred side of operators and sensors (one shared store poller per triggerer),
and the placement DAG's wake-up.
"""
