"""The encoders: the PyTorch reference, tokens and documents, the frozen graph encoder, hidden states
compared, the tiny random models, counted work (`perf`), and the trainable modules (`trainable/`)."""
