"""Microbenchmarks that calibrate a device once (``roller calibrate``): peak compute per dtype,
bandwidth of every memory level, the small-transfer cost.

- ``roller.targets.cpu.microbench.kernels``: the TVM kernels (register-tile peak, vectorized streams, strided rows) and
  their numpy references;
- ``roller.targets.cpu.microbench.plan``: what to measure on a device (working set per level, sweep, tiles), plain Python;
- ``roller.targets.cpu.microbench.runner``: measures a plan in its own process (``python -m
  roller.targets.cpu.microbench.runner``);
- ``roller.targets.cpu.microbench.prefetch``: the probe of whether software prefetch of prepacked weights pays;
- ``roller.targets.cuda.microbench``: a GPU's kernels (FMA chains, DRAM / L2 / shared-memory reads, strided rows), its plan
  and its measurement on a ``roller.targets.cuda.runtime`` runtime (TVM's CUDA runtime; the OpenCL twin in tests).

``roller.targets.cpu.calibrate`` runs the plan, summarises, checks and caches the figures.
"""
