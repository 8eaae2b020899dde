"""`bench.py serve`: one workload at one rate against an OpenAI endpoint, summarised as vLLM's
serving benchmark does."""
