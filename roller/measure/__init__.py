"""Measuring and checking kernels, whatever the target: timing on a noisy machine, choosing among timed
candidates, checking outputs against a reference."""
