"""Model → artifact: torch → ONNX export, ONNX checks, and backend artifacts (ORT Q/DQ ONNX).

This package never imports ``deploy_opt``. Heavy backends are imported inside the functions that use them.
"""
