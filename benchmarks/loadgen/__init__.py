"""The library the experiments in benchmarks/<name>/ share; not an experiment itself (bench.py
runs none of it directly). Mostly the load generator behind `bench.py serve|slo|linkbw|crossover`:

client          one streamed completion, timed as vllm bench serve times it
prompts, corpus, tokenizer_source   prompts of a requested token length
runner, measure one workload against endpoints: warm-up, pacing, records, summary
records, stats   per-request metrics and which met an SLO; a run's summary as vLLM prints it
                (the SLO, statistics and goodput searches are minipd.slo's, in seconds)
rate_sweep      request-rate sweeps of several deployments, interleaved
deployments, processes, signals     minipd started through its command line, always stopped
netns, netns_cluster                a tc-shaped veth between network namespaces for the KV
crossover_model, probes, model_facts, server_metrics   the crossover's model and probes
host_load       how much of the machine other jobs took during a run
options, plotting                   shared flags and figures
baseline_plots  the engine, transport, overlap, neighbour, profile and soak figures
"""
