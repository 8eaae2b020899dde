"""Where a model's weights come from, other than a GGUF file (`gguf`): a Hugging Face directory
(config.json + safetensors) loaded into the model (`hf_loader`), and real models shipped as
Python packages, found by name for `--model NAME` (`packaged_models`).

The engine decides which to use (`minipd/engine/model_loader.py`).
"""
