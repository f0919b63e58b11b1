"""The GPU machine's device check: the driver (``check.py``), its optimizer and LLM sections, the small LM."""
