"""LLM weight quantization, torch only: round-to-nearest groups (rtn.py), GPTQ and AWQ."""
