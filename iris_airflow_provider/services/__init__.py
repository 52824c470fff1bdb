"""Services: the federation's operations (submit, cancel, the placement tick, delivery, mirroring,
the receiver, read models), orchestrating the store, peers and backends by calling downward
only.
"""
