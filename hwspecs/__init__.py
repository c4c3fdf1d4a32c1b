"""Shipped device specs (YAML). Installed as the package ``roller.hwspecs``."""
