"""`bench.py crossover`: per prompt length, the link bandwidth where KV transfer cost equals
prefill interference."""
