"""``quantization.mode: auto``: search placement, scheme, SmoothQuant, fallback and latency for the fastest INT8
model that meets the gate, or say plainly that FP32 is fastest here."""
