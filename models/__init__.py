"""The model side of minipd: everything from a weights file to logits, and nothing of serving.

Sub-packages, from the bottom up (each imports only the ones before it; tests/unit/test_layers.py
checks it):
- `kernels`: minipd's C++ CPU kernels (the .cpp/.h sources), their build at install or first use, the CPU's flags;
- `weights`: how weights are held and multiplied outside a plain `nn.Linear` (GGUF's blocks,
  oneDNN-packed bfloat16, the block embedding, huge-page arenas) and the summary of that format;
- `arch`: the Llama-family architecture: its config and presets, RoPE, paged attention, the model;
- `kernel_steps`: the model's steps run by the C++ kernels (the fused decode step, prefill kernels);
- `gguf`: GGUF files: reading one, loading its model, serving its quantized tensors as stored;
- `tokenizers`: the tokenizer interface and its byte-level, tokenizer.json and GGUF-built tokenizers;
- `checkpoints`: other sources of weights: Hugging Face directories, models shipped as Python packages.
"""
