"""Quantization-aware training on any ONNX graph: fake quantization, the student graph, losses and the loop."""
