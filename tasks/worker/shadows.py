"""Shadow copies in the worker: a routed job with shadows leaves its top label for them, and each shadow's top
label is compared with it, per (route, served model, shadow model), in Redis for ``swapless status`` and in the
metrics.

A shadowed job's reference is kept ``SHADOW_REF_S`` beside its result (``ResultStore.shadow_ref_key``): its caller
may read and forget its result long before its bulk-priority shadows run. A shadow whose served job failed, or has
not finished yet, is not compared.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from manager import Outcome
from tasks.broker.results import ResultStore
from tasks.broker.routes import count_shadow
from tasks.keyspace import Keyspace
from tasks.observe.accounting import SchedulerObserver
from tasks.worker.delivery import Delivery

__all__ = ["SHADOW_REF_S", "Shadows"]

#: Seconds a shadowed job's top label is kept for its shadow copies (they run at bulk priority, maybe much later).
SHADOW_REF_S = 3600


def _top(prediction: Any) -> Any:
    """The top label of a prediction (a list of ``{label, score}``, best first), or the prediction itself."""
    if isinstance(prediction, list) and prediction and isinstance(prediction[0], dict):
        return prediction[0].get("label")
    return prediction


class Shadows:
    """Keeps shadowed jobs' references and counts their shadows' agreement.

    Args:
        keyspace: the queue's keys (its agreement counts).
        observer: told of every comparison (the metrics).
    """

    def __init__(self, keyspace: Keyspace, observer: SchedulerObserver) -> None:
        self.keyspace = keyspace
        self.observer = observer

    def settle(self, results: ResultStore, answered: Sequence[tuple[Delivery, Outcome]]) -> None:
        """After ``answered`` jobs' results are stored: keep the references of shadowed ones, compare shadows."""
        references = {o.job.id: json.dumps([o.job.model_id, _top(o.result)]) for d, o in answered
                      if d.shadowed and o.error is None}
        if references:
            pipe = results.client.pipeline(transaction=False)
            for job_id, reference in references.items():
                pipe.set(results.shadow_ref_key(job_id), reference, ex=SHADOW_REF_S)
            pipe.execute()
        shadows = [(d.shadow_of, o) for d, o in answered if d.shadow_of is not None]
        if shadows:
            self._compare(results, shadows)

    def _compare(self, results: ResultStore, shadows: list[tuple[tuple[str, str], Outcome]]) -> None:
        raws = results.client.mget([results.shadow_ref_key(served) for (served, _), _ in shadows])
        counts: dict[tuple[str, str, str, bool], int] = {}
        for ((_, route_id), outcome), raw in zip(shadows, raws, strict=True):
            if raw is None or outcome.error is not None:
                continue  # the served job failed, or has not finished yet
            served_model, served_top = json.loads(raw)
            pair = (route_id, served_model, outcome.job.model_id, served_top == _top(outcome.result))
            counts[pair] = counts.get(pair, 0) + 1
        if counts:
            count_shadow(results.client, self.keyspace, counts)
            for (route_id, served_model, shadow_model, agreed), n in counts.items():
                self.observer.on_shadow(route_id, served_model, shadow_model, agreed, n)
