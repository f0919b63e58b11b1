"""Typed config: the generic YAML -> frozen dataclass loader, the build config, the serve section and the hardware
profiles.
"""
