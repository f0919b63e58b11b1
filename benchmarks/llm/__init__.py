"""Weight-only LLM quantization: methods, the GPTQ cross-check, the KV cache and on-loading."""
