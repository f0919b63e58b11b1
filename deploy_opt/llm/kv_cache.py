"""KV-cache quantization before anyone serves it: lmdeploy's int8/int4 KV cache simulated inside the HF model on the
CPU, and the memory it saves.

lmdeploy quantizes K (after the rotary embedding) and V as they enter the cache, asymmetrically, per head and per
token (one scale and zero point for the ``head_dim`` values of each head at each position; lmdeploy's docs,
"INT4/INT8 KV Cache"). The simulation does the same to every key and value a Hugging Face ``DynamicCache`` receives:
``q = round((x - min) / s)``, ``s = (max - min) / (2^bits - 1)``, then back to ``q * s + min``, so attention reads
what the quantized cache would hold. It is on while :func:`simulated_kv_cache` is entered; ``perplexity`` and the
stability run turn the cache on (``use_cache=True``) when they simulate.

Memory: per token, ``2 (K and V) x layers x kv_heads x head_dim`` values: 2 bytes each in fp16; ``bits / 8`` bytes
each plus one fp16 scale and one fp16 zero point per head (4 bytes) quantized.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)

KV_BITS = {"int8": 8, "int4": 4}
# lmdeploy 0.18's --quant-policy: TurboMindEngineConfig and PytorchEngineConfig (lmdeploy/messages.py) both take
# 4 and 8 on CUDA (the PyTorch engine also 16/17 for fp8, which deploy_opt does not simulate).
QUANT_POLICY = {"int8": 8, "int4": 4}
ENGINE_POLICIES = {"turbomind": (4, 8), "pytorch": (4, 8)}
SCALE_ZERO_BYTES = 4  # one fp16 scale and one fp16 zero point per head and token


def kv_bits(kv_cache: str) -> int | None:
    """8, 4, or None for ``none``; anything else is a one-line ConfigError."""
    if kv_cache == "none":
        return None
    if kv_cache not in KV_BITS:
        raise ConfigError(f"kv_cache {kv_cache!r}: use none, int8 or int4")
    return KV_BITS[kv_cache]


def fake_quantize(states: Any, bits: int) -> Any:
    """Per head and token (the last dim is head_dim) asymmetric quantize-dequantize, in the input's dtype."""
    import torch

    x = states.float()
    low = x.amin(dim=-1, keepdim=True)
    high = x.amax(dim=-1, keepdim=True)
    levels = 2**bits - 1
    scale = ((high - low) / levels).clamp(min=torch.finfo(torch.float32).tiny)
    codes = torch.round((x - low) / scale).clamp_(0, levels)
    return (codes * scale + low).to(states.dtype)


@contextlib.contextmanager
def simulated_kv_cache(bits: int | None) -> Iterator[None]:
    """While entered, every ``DynamicCache`` stores (and attention reads) keys and values quantized to ``bits``."""
    if bits is None:
        yield
        return
    from transformers.cache_utils import DynamicCache

    original = DynamicCache.update

    def update(self: Any, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        return original(
            self, fake_quantize(key_states, bits), fake_quantize(value_states, bits), layer_idx, *args, **kwargs
        )

    DynamicCache.update = update  # type: ignore[method-assign]
    try:
        yield
    finally:
        DynamicCache.update = original  # type: ignore[method-assign]


def kv_memory(model_config: Any, session_len: int, bits: int | None) -> dict[str, Any]:
    """KV-cache bytes for one sequence of ``session_len`` tokens: fp16 against ``bits`` (with scales and zeros)."""
    layers = int(model_config.num_hidden_layers)
    heads = int(model_config.num_attention_heads)
    kv_heads = int(getattr(model_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(model_config, "head_dim", None) or model_config.hidden_size // heads)
    per_token_fp16 = 2 * layers * kv_heads * head_dim * 2
    record: dict[str, Any] = {
        "session_len": session_len,
        "layers": layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "fp16_bytes_per_token": per_token_fp16,
        "fp16_bytes": per_token_fp16 * session_len,
    }
    if bits is not None:
        per_token = 2 * layers * kv_heads * (head_dim * bits // 8 + SCALE_ZERO_BYTES)
        record.update(
            {
                "bits": bits,
                "bytes_per_token": per_token,
                "bytes": per_token * session_len,
                "saved_bytes": (per_token_fp16 - per_token) * session_len,
                "saved_fraction": 1 - per_token / per_token_fp16,
            }
        )
    return record


def check_engine_policy(kv_cache: str, backend: str) -> int:
    """lmdeploy's ``--quant-policy`` for ``kv_cache`` on ``backend``; ConfigError when that engine lacks it."""
    policy = QUANT_POLICY.get(kv_cache)
    if policy is None:
        raise ConfigError(f"--kv-cache {kv_cache!r}: use int8 or int4 (or none)")
    supported = ENGINE_POLICIES.get(backend, ())
    if policy not in supported:
        raise ConfigError(
            f"--kv-cache {kv_cache}: lmdeploy's {backend} engine takes --quant-policy "
            f"{', '.join(map(str, supported)) or 'none'}, not {policy}; fix: another --kv-cache or "
            "--backend"
        )
    return policy
