"""`bench.py overlap`: exposed KV transfer, layer-wise streaming against send-after-prefill."""
