"""Recipe `benchmarks` (outside `all`): the encoders timed against the machine's limit."""
