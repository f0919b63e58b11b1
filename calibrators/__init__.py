"""Data → ranges: activation collection, range methods and the scale file they produce.

This package never imports ``deploy_opt``; the range maths is plain numpy.
"""
