"""`bench.py linkbw`: TTFT and SLO attainment against KV link bandwidth (token bucket, shaped veth)."""
