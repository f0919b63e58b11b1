"""torch -> ONNX: export, simplify, checker and FP32 parity, and atomic ONNX saving."""
