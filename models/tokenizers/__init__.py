"""Tokenizers: the interface the engine, router and API use, the byte-level one of the presets and
the Hugging Face `tokenizers` one of a `tokenizer.json` (`tokenizer`), and the one a GGUF file's
metadata describes (`gguf_tokenizer`).

It loads no weights; the `tokenizers` library it wraps is imported by that name, not this package.
"""
