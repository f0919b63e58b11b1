"""The data sources: ``module:function`` callables, files by type (arrays, images, text, datasets), batches."""
