"""The load client: streamed completions timed as `vllm bench serve` times them, prompts of a
requested token length, the runner that sends a workload (minipd.ops.workload) at its arrival
times or at a fixed concurrency, and per-request records.

Used by the benchmarks (`bench.py serve|slo|...`, with the strict OpenAI check) and by the
router's built-in load generator (minipd/ops/loadgen/builtin_load.py); HTTP only, no model code.
"""
