"""The vocabulary every stage shares: batches and user callables (sources), metrics (with detection F1),
evaluation of a runner over batches, and the uncertainty of a measured drop. It imports no other deploy_opt
package but config, so analysis, autotune, prune, qat, train and build all stand on it.
"""
