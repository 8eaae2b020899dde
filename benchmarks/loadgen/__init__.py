"""The library the experiments in benchmarks/<name>/ share; not an experiment itself (bench.py
runs none of it directly). The load client itself (one streamed completion, prompts, the
runner, per-request records) is `minipd.ops.loadgen`, so the router's built-in load uses it too;
here is what the experiments add around it:

tokenizer_source   which tokenizer measures prompts, from --model / --tokenizer
measure         one workload against endpoints, rerun when the host was busy, and its summary
stats           a run's summary as vLLM prints it
                (the SLO, statistics and goodput searches are minipd.slo's, in seconds)
rate_sweep      request-rate sweeps of several deployments, interleaved
deployments, processes, signals     minipd started through its command line, always stopped
netns, netns_cluster                a tc-shaped veth between network namespaces for the KV
crossover_model, probes, model_facts, server_metrics   the crossover's model and probes
host_load       how much of the machine other jobs took during a run
options, plotting                   shared flags and figures
baseline_plots  the engine, transport, overlap, neighbour, profile and soak figures
"""
