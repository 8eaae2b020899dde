"""GGUF files (llama.cpp's format): reading the header, metadata and a tensor's bytes (`gguf_file`),
loading a llama-architecture file into the model (`gguf_loader`), and serving its Q4_0/Q4_1/Q8_0
tensors from their blocks (`gguf_quantized`).

The tokenizer a GGUF file describes is built in `tokenizers.gguf_tokenizer`; decoding the data
blocks is left to the `gguf` library (imported by that name, not this package).
"""
