"""Sensitivity and mixed precision: per-node ranking (analyze), the linearised proxy (noise), Q/DQ variants, the
fallback search and the heatmap.
"""
