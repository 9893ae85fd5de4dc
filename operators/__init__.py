"""Ready-made TrainingOperators built only on the public raysgd API (none yet)."""
