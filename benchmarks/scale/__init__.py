"""`bench.py scale`: the controller scaling pools on Ray against switch-only, on a load that peaks."""
