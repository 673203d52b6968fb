"""Runtime support: compiled artifacts, memory, and the on-disk compile cache."""
