"""Whole models: the Relax pass that schedules every fused function, the ONNX frontend, the per-function kernel cache."""
