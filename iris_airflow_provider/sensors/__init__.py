"""Sensors: `IrisFederatedJobSensor` waits on a job another task submitted (accepted, running or
complete), in the triggerer.
"""
