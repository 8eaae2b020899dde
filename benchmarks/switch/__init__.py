"""`bench.py switch`: an in-place role switch, from decision to serving, drain excluded and included."""
