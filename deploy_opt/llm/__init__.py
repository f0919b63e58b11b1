"""The LLM path: calibration and evaluation text, model loading (HF folders and GGUF) and quality checks."""
