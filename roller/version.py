"""The package version, one place for the root package and the kernel cache key."""
__version__ = "0.1.0"
