"""Recipe `parity`: the texts selected (`selection`), ONNX Runtime against PyTorch per model
(`parity`), and the tables (`parity_tables`)."""
