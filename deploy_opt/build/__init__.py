"""The INT8 build: pipeline.py composes one module per stage (source, export, calibrate, quantize, evaluate,
benchmark, backends).
"""
