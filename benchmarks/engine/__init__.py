"""`bench.py engine`: serving tok/s against HF static batches, the decode step against its floor,
bf16 against fp32 (engine_bench); the decode-step timings (engine_decode) and the serving
comparison (engine_serving) it is built from."""
