"""The Llama-family architecture (Llama, Qwen2): `ModelConfig` and the presets (`model_config`),
rotary embeddings and their scalings (`rope`), paged attention over the KV pool's blocks
(`paged_attention`), and the decoder with its eager serving and reference forwards (`llama`).

It loads no weights (`gguf`, `checkpoints`) and holds no tokenizer (`tokenizers`); the
kernel-run decode step and prefill ops over the same model are in `kernel_steps`.
"""
