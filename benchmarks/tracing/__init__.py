"""bench.py tracing: the cost of --otlp-traces-endpoint at `bench.py slo`'s load."""
