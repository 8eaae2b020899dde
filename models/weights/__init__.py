"""How weights are held and multiplied where a plain `nn.Linear`/`nn.Embedding` would not do:
GGUF's blocks multiplied by a kernel that reads them (`quantized_linear`), bfloat16 weights
packed once for oneDNN (`prepacked_linear`), input embeddings read from Q8_0 blocks
(`block_embedding`), the huge-page arena the packed blocks sit in (`huge_pages`), and the name
and description of the format a model's weights are served in (`weights_summary`).

It holds no architecture (`arch`) and reads no file (`gguf`, `checkpoints`); it builds on `kernels`.
"""
