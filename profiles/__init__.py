"""Hardware presets (YAML), shipped inside the wheel and read with importlib.resources."""
