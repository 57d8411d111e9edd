"""Placement across workers: which worker holds which model (``plan``, a pure function over plain data)."""
