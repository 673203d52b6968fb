"""Frontends: PyTorch (``taskmap.frontend.torch``; imported on demand, torch is optional)."""
