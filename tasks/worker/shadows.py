"""Shadows: a shadowed job's top label compared with its shadows', per (route, served model, shadow model).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from typing import Any

from swapless.manager import Outcome
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.accounting import SchedulerObserver
from swapless.tasks.routing import count_shadow
from swapless.tasks.worker.delivery import Delivery

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
        """After ``answered`` jobs' results are stored: keep shadowed jobs' references and compare the shadows."""
        counts: collections.Counter[tuple[str, str, str, bool]] = collections.Counter()
        served = [(o.job.id, o.job.served_model, _top(o.result)) for d, o in answered if d.shadowed and o.error is None]
        if served:
            pipe = results.client.pipeline(transaction=False)
            for job_id, model_id, top in served:
                key = results.shadow_ref_key(job_id)
                pipe.eval(_KEEP_REF, 2, key, key + _WAITING, json.dumps([model_id, top]), SHADOW_REF_S)
            for (_, model_id, top), waiting in zip(served, pipe.execute(), strict=True):
                for raw in waiting:
                    route_id, shadow_model, shadow_top = json.loads(raw)
                    counts[(route_id, model_id, shadow_model, top == shadow_top)] += 1
        shadows = [(d.shadow_of, o) for d, o in answered if d.shadow_of is not None and o.error is None]
        if shadows:
            pipe = results.client.pipeline(transaction=False)
            for (of, route_id), outcome in shadows:
                key = results.shadow_ref_key(of)
                pipe.eval(_COMPARE_OR_WAIT, 2, key, key + _WAITING,
                          json.dumps([route_id, outcome.job.served_model, _top(outcome.result)]), SHADOW_REF_S)
            for ((_, route_id), outcome), raw in zip(shadows, pipe.execute(), strict=True):
                if raw is None:
                    continue  # its served job has not finished: it compares this one when it does
                served_model, served_top = json.loads(raw)
                counts[(route_id, served_model, outcome.job.served_model, served_top == _top(outcome.result))] += 1
        if counts:
            count_shadow(results.client, self.keyspace, counts)
            for (route_id, served_model, shadow_model, agreed), n in counts.items():
                self.observer.on_shadow(route_id, served_model, shadow_model, agreed, n)


#: Suffix of the key where shadows that finished before their served job wait for it, beside its reference's key.
_WAITING = ":waiting"

#: The served side: keep the reference (KEYS[1]) and take the shadows waiting for it (KEYS[2]).
_KEEP_REF = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local waiting = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[2])
return waiting
"""

#: The shadow side: the reference if it is there, else wait for it (the served side compares).
_COMPARE_OR_WAIT = """
local reference = redis.call('GET', KEYS[1])
if reference then
  return reference
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return false
"""
