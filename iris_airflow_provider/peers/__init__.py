"""Peers: remote clusters this one hands whole jobs to. One protocol, one transport per module."""
