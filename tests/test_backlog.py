"""The autoscaling backlog estimated from plain readings, without Redis."""

from swapless.tasks.cluster.members import Heartbeat
from swapless.tasks.observe.backlog import ClusterRecords, Learned, estimate
from swapless.tasks.observe.waiting import ModelWaiting, QueueWaiting


def _beat(models: dict[str, dict[str, float]], loaded: list[str]) -> Heartbeat:
    return Heartbeat.model_validate({
        "hostname": "w", "worker_id": "w", "pid": 1, "queue": "q", "started_at": 0, "sent_at": 0,
        "interval_s": 1, "cache": {"max_models": 2, "memory_budget_bytes": None, "used_bytes": 0, "hits": 0,
                                   "misses": 0, "loads": 0, "evictions": 0, "load_failures": 0},
        "loaded": [{"model_id": m, "bytes": 1, "load_s": 1.0, "hits": 0, "remote": False, "busy": False,
                    "loaded_at": 0.0} for m in loaded],
        "models": models, "jobs_done": 0, "jobs_failed": 0, "backlog": 0, "queue_wait": {},
    })


def _records(by_model: dict[str, ModelWaiting], workers: list[Heartbeat], learned: Learned) -> ClusterRecords:
    waiting = QueueWaiting(by_model, {0: 0, 3: 0, 6: 0, 9: 0}, 0, 0, False, False, 100)
    return ClusterRecords(now=100.0, waiting=waiting, workers=workers, learned=learned)


def test_learned_costs_at_the_batch_size_the_backlog_fills_and_no_load_where_it_is_loaded() -> None:
    records = _records(
        {"m": ModelWaiting("m", 2, 40, {6: 90.0}), "cold": ModelWaiting("cold", 1, 1),
         "unknown": ModelWaiting("unknown", 1, 1)},
        [_beat({"m": {"backlog": 8, "run_s_total": 1.0, "jobs_done": 10}}, loaded=["m"])],
        {"m": {"gpu": {"batch_costs_s": {"1": 0.05, "32": 0.002}, "load_s": 3.0}},
         "cold": {"gpu": {"batch_costs_s": {"1": 0.05}, "load_s": 2.0}}},
    )
    reading = estimate(records, ["m", "cold"], unknown_job_s=0.5, unknown_load_s=10.0)
    m, cold = reading.models["m"], reading.models["cold"]
    assert (m.waiting_jobs, m.held, m.job_s, m.load_s, m.measured) == (40, 8, 0.002, 0.0, True)  # 48 jobs fill 32
    assert m.oldest_age_s == {6: 10.0}
    assert (cold.job_s, cold.load_s, cold.measured) == (0.05, 2.0, True)
    assert set(reading.models) == {"m", "cold"}  # a model outside the models file is left out
    assert reading.jobs == 49


def test_a_model_never_measured_counts_the_unknown_defaults() -> None:
    reading = estimate(_records({"new": ModelWaiting("new", 3, 3)}, [], {}), ["new"], unknown_job_s=0.5,
                       unknown_load_s=10.0)
    new = reading.models["new"]
    assert (new.job_s, new.load_s, new.measured, new.seconds) == (0.5, 10.0, False, 3 * 0.5 + 10.0)
