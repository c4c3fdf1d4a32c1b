"""Building kernels: constructing plans, compiling candidates in worker processes, checking them against numpy, timing them and reporting."""
