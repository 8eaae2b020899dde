"""`bench.py profile`: prefill/decode step times fitted into a planner latency profile."""
