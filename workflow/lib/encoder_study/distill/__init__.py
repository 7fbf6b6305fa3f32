"""The distilled student: `student` (architecture), `export` (ONNX + parity), `data`, `objective`, `train`."""
