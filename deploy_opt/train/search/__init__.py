"""``train search``: a coarse grid (optimizer x LR decade, short runs), then Optuna TPE around the winner, with
trials as Ray tasks, SQLite storage for resuming, and a report. Ray and Optuna are the ``search`` extra; nothing
here is imported by the core or by ``--help``.
"""
