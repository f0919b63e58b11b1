"""The one scale file every backend loads: its format (format.py) and JSON Schema (schema.py, scales.schema.json)."""
