"""Several workers as one cache: the plan, the claims, this worker's placer, the heartbeats, each model's
standing."""
