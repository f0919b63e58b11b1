"""The real-model corpus: one module per model family, the peers, measurement, scoring and RESULTS.md."""
