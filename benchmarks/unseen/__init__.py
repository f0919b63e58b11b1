"""Models nobody tuned for: configs naming only model, inputs, data and metric, and their data modules."""
