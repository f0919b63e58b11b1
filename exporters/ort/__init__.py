"""ONNX Runtime Q/DQ: the model written by ORT's quantizer from scales.json, and its TensorQuantOverrides."""
