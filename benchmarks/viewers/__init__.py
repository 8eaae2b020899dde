"""`bench.py viewers`: what the router's dashboard costs (router CPU with viewers open, TTFT/ITL at slo's load)."""
