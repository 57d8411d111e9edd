"""Several workers as one cache: who should hold which model (``plan``, a pure function over plain data), the
claims on models (``claims``), this worker's part in it (``placer``), the workers' heartbeats (``members``) and
each model's standing as Redis holds it (``view``)."""
