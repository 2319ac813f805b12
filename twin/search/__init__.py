"""Plan search: every valid plan for a model, GPU count and batch, ranked by simulated step time."""
