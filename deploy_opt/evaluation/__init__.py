"""What evaluates: metrics (with detection F1), evaluation of a runner over batches, numerics, and the uncertainty
of a measured drop. It imports no other deploy_opt package but data (batches, user callables, labels), so
analysis, autotune, prune, qat, train and build all stand on it.
"""
