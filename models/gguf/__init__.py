"""GGUF files (llama.cpp's format): reading the header, metadata and a tensor's bytes (`gguf_file`),
decoding every tensor type minipd reads to float32 (`gguf_dequantize`), loading a llama- or
qwen2-architecture file into the model (`gguf_loader`, which logs the quantized weight matrices it
dequantized: `dequantized_log`), and serving its Q4_0/Q4_1/Q8_0 tensors from their blocks
(`gguf_quantized`).

The tokenizer a GGUF file describes is built in `tokenizers.gguf_tokenizer`; the `gguf` library
(imported by that name, not this package) gives the type constants and block sizes.
"""
