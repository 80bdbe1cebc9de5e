"""What is on disk: model folder formats, I/O roles and decode paths, the ONNX scan, inspect."""
