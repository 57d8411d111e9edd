"""Seeing what the queue and the workers do: accounting, heartbeats, metrics, task events, the waiting work,
the status and the autoscaling signals. It imports nothing of the worker, the client or the gateway.
"""
