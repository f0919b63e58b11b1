"""Analysis of a build: sensitivity/ (ranking, noise propagation, mixed precision), the torch evaluator of ONNX
graphs, compare, compat and align.
"""
