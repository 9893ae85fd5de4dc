"""Where a run's checkpoints and logs are stored: local disk or ``pyarrow.fs`` storage."""
