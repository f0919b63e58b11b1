"""Activation statistics: ORT collection (collect.py, the only ORT-aware file), observers (minmax, histogram,
streaming, per-channel) and the range methods that turn them into ranges.
"""
