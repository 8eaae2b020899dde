"""`bench.py transport`: KV transfer bandwidth of every backend against memcpy and a raw socket."""
