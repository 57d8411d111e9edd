"""Offline models for the tests, the benchmarks and ``swapless demo``: real architectures with random weights
(``tiny``), the demo's set with its trained sentiment model (``models``) and its sample of reviews (``sample``,
``data/reviews.jsonl``)."""
