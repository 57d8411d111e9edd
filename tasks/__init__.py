"""The queue side: the Celery app, the batch task, the producer client and the CLI. Nothing here knows a framework.

``celery -A tasks worker`` finds the app as ``tasks.celery``. It is built on first access, not at import, so that
``python -m tasks.cli`` can report a bad setting as one clear line instead of a traceback.
"""

from typing import Any

__all__ = ["celery"]


def __getattr__(name: str) -> Any:
    if name == "celery":
        from tasks.app import app

        return app
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
