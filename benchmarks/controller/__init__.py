"""`bench.py controller`: the live P:D ratio controller against a fixed ratio, on a shifting workload."""
