"""`bench.py slo`: SLO attainment and goodput against request rate, colocated and disaggregated."""
