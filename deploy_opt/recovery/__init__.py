"""Accuracy recovery on the ONNX graph: FP32 → FP32 transforms that make a model quantize better.

Each is a plain function from an FP32 model (and, where it needs them, calibration feeds and the weight and
activation parameters it will be quantized with) to a frozen result holding the transformed FP32 model and a
record of what changed. The quantizer then writes the transformed model as it writes any other, so scales.json
stays the one source of every parameter and TensorRT takes the weights (per-channel symmetric int8).
"""
