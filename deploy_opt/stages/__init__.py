"""The INT8 build's stages, one module each (inputs, export, calibrate, quantize, smoothing, backends, verify,
runtime, benchmark, splits, summary); ``deploy_opt/pipeline/build.py`` composes them.
"""
