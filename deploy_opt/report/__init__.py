"""What a run tells: the gates (gate.py: apply_gate over a BuildRecord, threshold parsing), build.json as one typed
record (build_record.py, its sections in record_sections.py and model_sections.py, the CLI's view in outcome.py),
new records and summary.md (record.py), the integrity and trust criteria, and the plots. The HTML pages:
html_parts.py (the pieces every page is made of), charts.py, build_page.py (a build's report.html),
llm_train_pages.py (an LLM or training run's), folder_page.py (the ``report`` command: whichever page a run folder
needs).
"""
