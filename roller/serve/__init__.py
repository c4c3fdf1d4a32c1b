"""Serving: the JIT an inference server calls, and kernels for dynamic shapes served on buckets."""
