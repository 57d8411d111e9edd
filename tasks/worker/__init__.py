"""The worker: the batch task, its scheduler thread and what they use. Only worker processes import it.
"""
