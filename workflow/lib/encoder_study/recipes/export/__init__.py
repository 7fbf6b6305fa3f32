"""Recipe `export`: sources acquired (`acquire`), each model exported to ONNX and checked (`export`),
the exports table (`exports`)."""
