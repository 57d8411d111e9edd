"""Shadow comparisons (``swapless.tasks.worker.shadows``) against the real Redis: a shadow that finishes before its
served job is compared when the served job finishes, and every pair is compared once, whichever side finishes first."""

from __future__ import annotations

import uuid
from typing import Any

import redis

from swapless.config.settings import Settings
from swapless.manager import Job, Outcome
from swapless.tasks.app import make_app
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.accounting import NULL_OBSERVER
from swapless.tasks.routing import read_shadow
from swapless.tasks.worker.delivery import Delivery
from swapless.tasks.worker.shadows import Shadows


def _answered(job_id: str, model_id: str, label: str, **delivery: Any) -> tuple[Delivery, Outcome]:
    job = Job(job_id, model_id, "x")
    return Delivery(None, (job,), False, **delivery), Outcome(job, result=[{"label": label, "score": 1.0}])


def test_each_pair_is_compared_once_whichever_finishes_first(swapless_env: dict[str, str]) -> None:
    app = make_app()
    store = ResultStore(app, client=redis.Redis.from_url(app.conf.result_backend))
    keyspace = Keyspace.of(Settings())
    shadows = Shadows(keyspace, NULL_OBSERVER)
    early, late = str(uuid.uuid4()), str(uuid.uuid4())
    # the shadow of `early` finishes first (its model's list was claimed first): nothing to compare with yet
    shadows.settle(store, [_answered(f"{early}.shadow0", "v3", "pos", shadow_of=(early, "sentiment"))])
    assert read_shadow(store.client, keyspace) == {}
    # its served job finishes: the waiting shadow is compared now (they agree)
    shadows.settle(store, [_answered(early, "v1", "pos", shadowed=True)])
    assert read_shadow(store.client, keyspace) == {("sentiment", "v1", "v3"): (1, 1)}
    # the usual order: the served job first, then its shadow (they differ)
    shadows.settle(store, [_answered(late, "v1", "neg", shadowed=True)])
    shadows.settle(store, [_answered(f"{late}.shadow0", "v3", "pos", shadow_of=(late, "sentiment"))])
    assert read_shadow(store.client, keyspace) == {("sentiment", "v1", "v3"): (1, 2)}
    # nothing is left waiting, and nothing is counted twice
    shadows.settle(store, [_answered(early, "v1", "pos", shadowed=True)])  # a redelivered copy of the served job
    assert read_shadow(store.client, keyspace) == {("sentiment", "v1", "v3"): (1, 2)}
    assert not store.client.exists(store.shadow_ref_key(early) + ":waiting")
