"""What a build tells: the gates (gate.py owns Criterion and threshold parsing), build.json and summary.md
(record.py) and the calibration plot.
"""
