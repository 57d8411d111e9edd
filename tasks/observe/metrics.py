"""The worker's Prometheus endpoint (``swapless worker --metrics-port``; off by default), from a private registry
served by prometheus-client in a daemon thread. ``METRICS`` names them; docs/concepts/several-workers.md says what
each measures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swapless.config.errors import MetricsUnavailable
from swapless.manager import ModelManager
from swapless.tasks.observe.accounting import GroupReport

__all__ = ["METRICS", "WorkerMetrics"]

#: The metric names a worker exports, as scraped (counters with ``_total``).
METRICS = (
    "swapless_model_load_seconds",
    "swapless_model_load_failures_total",
    "swapless_model_swap_in_seconds",
    "swapless_cache_hits_total",
    "swapless_cache_misses_total",
    "swapless_cache_evictions_total",
    "swapless_batch_size",
    "swapless_job_queue_wait_seconds",
    "swapless_job_run_seconds",
    "swapless_jobs_total",
    "swapless_job_errors_total",
    "swapless_jobs_not_run_total",
    "swapless_shadow_compared_total",
    "swapless_models_loaded",
    "swapless_model_loaded_bytes",
    "swapless_models_host",
    "swapless_model_host_bytes",
    "swapless_model_tier",
    "swapless_backlog_jobs",
    "swapless_model_claimed",
)

_LOAD_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _CacheCollector(Collector):
    """Gauges read from the cache and the backlog at scrape time."""

    def __init__(
        self, manager: ModelManager, backlog: Callable[[], dict[str, int]], claimed: Callable[[], list[str]]
    ) -> None:
        self.manager = manager
        self.backlog = backlog
        self.claimed = claimed

    def collect(self) -> Iterator[Metric]:
        entries = self.manager.snapshot()
        loaded = GaugeMetricFamily("swapless_models_loaded", "Models in the cache now.")
        loaded.add_metric([], len(entries))
        size = GaugeMetricFamily("swapless_model_loaded_bytes", "Bytes of each loaded model.", labels=["model"])
        for entry in entries:
            size.add_metric([entry.model_id], entry.size_bytes)
        backlog = GaugeMetricFamily("swapless_backlog_jobs", "Jobs held by this worker, waiting.", labels=["model"])
        for model_id, waiting in self.backlog().items():
            backlog.add_metric([model_id], waiting)
        claimed = GaugeMetricFamily("swapless_model_claimed", "Models this worker holds a claim on.", labels=["model"])
        for model_id in self.claimed():
            claimed.add_metric([model_id], 1)
        host_entries = self.manager.host.snapshot()
        host = GaugeMetricFamily("swapless_models_host", "Models in the host tier now.")
        host.add_metric([], len(host_entries))
        host_size = GaugeMetricFamily(
            "swapless_model_host_bytes", "Bytes of each model in the host tier.", labels=["model"]
        )
        tier = GaugeMetricFamily(
            "swapless_model_tier", "1 for each model on the device or in the host tier.", labels=["model", "tier"]
        )
        for entry in entries:
            tier.add_metric([entry.model_id, "device"], 1)
        for entry in host_entries:
            host_size.add_metric([entry.model_id], entry.size_bytes)
            tier.add_metric([entry.model_id, "host"], 1)
        yield from (loaded, size, backlog, claimed, host, host_size, tier)


class WorkerMetrics:
    """The Prometheus metrics of one worker. ``observe`` is a ``GroupAccounting`` listener.

    Args:
        manager, backlog, claimed: the worker's cache, its held jobs per model and its claimed models, read at
            scrape time.
        registry: where the metrics live; a fresh private registry by default.
    """

    def __init__(
        self,
        manager: ModelManager,
        backlog: Callable[[], dict[str, int]],
        registry: CollectorRegistry | None = None,
        claimed: Callable[[], list[str]] = list,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.load_seconds = Histogram(
            "swapless_model_load_seconds", "Seconds per model load.", ["model"], buckets=_LOAD_BUCKETS_S, registry=r
        )
        self.swap_in_seconds = Histogram(
            "swapless_model_swap_in_seconds", "Seconds per swap-in from the host tier.", ["model"],
            buckets=_LOAD_BUCKETS_S, registry=r,
        )
        self.load_failures = Counter("swapless_model_load_failures", "Model loads that failed.", ["model"], registry=r)
        self.hits = Counter("swapless_cache_hits", "Groups whose model was already loaded.", ["model"], registry=r)
        self.misses = Counter("swapless_cache_misses", "Groups that had to load their model.", ["model"], registry=r)
        self.evictions = Counter(
            "swapless_cache_evictions", "Times a model was unloaded to make room.", ["model"], registry=r
        )
        self.batch_size = Histogram(
            "swapless_batch_size", "Jobs per group run on one model.", ["model"], buckets=_BATCH_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            "swapless_job_queue_wait_seconds", "Seconds from a job's send (or receipt) to the start of its group.",
            ["model"], buckets=_WAIT_BUCKETS_S, registry=r,
        )
        self.run_seconds = Histogram(
            "swapless_job_run_seconds", "Seconds a job's group took, model load included.",
            ["model"], buckets=_WAIT_BUCKETS_S, registry=r,
        )
        self.jobs = Counter(
            "swapless_jobs", "Jobs run, by outcome (success, failure).", ["model", "outcome"], registry=r
        )
        self.errors = Counter("swapless_job_errors", "Failed jobs by error type.", ["model", "error"], registry=r)
        self.shadow = Counter(
            "swapless_shadow_compared",
            "Shadow copies compared with the served job, by whether their top labels agree.",
            ["route", "served", "shadow", "agree"],
            registry=r,
        )
        self.not_run = Counter(
            "swapless_jobs_not_run", "Jobs answered without running, by reason (expired, cancelled).",
            ["model", "reason"], registry=r,
        )
        r.register(_CacheCollector(manager, backlog, claimed))

    def observe(self, report: GroupReport) -> None:
        model = report.model_id
        for seconds in report.load_s:
            self.load_seconds.labels(model).observe(seconds)
        for seconds in report.swap_s:
            self.swap_in_seconds.labels(model).observe(seconds)
        if report.load_failures:
            self.load_failures.labels(model).inc(report.load_failures)
        if report.hits:
            self.hits.labels(model).inc(report.hits)
        if report.misses:
            self.misses.labels(model).inc(report.misses)
        for victim in report.evicted:
            self.evictions.labels(victim).inc()
        self.batch_size.labels(model).observe(report.size)
        wait = self.queue_wait.labels(model)
        run = self.run_seconds.labels(model)
        for seconds in report.queue_wait_s:
            wait.observe(seconds)
            run.observe(report.run_s)
        if report.succeeded:
            self.jobs.labels(model, "success").inc(report.succeeded)
        if report.failed:
            self.jobs.labels(model, "failure").inc(report.failed)
        for error, count in report.errors.items():
            self.errors.labels(model, error).inc(count)

    def skipped(self, model_id: str, reason: str, jobs: int) -> None:
        self.not_run.labels(model_id, reason).inc(jobs)
        if reason == "expired":  # their result is a failure, as JobExpired
            self.jobs.labels(model_id, "failure").inc(jobs)
            self.errors.labels(model_id, "JobExpired").inc(jobs)

    def shadowed(self, route_id: str, served: str, shadow: str, agreed: bool, jobs: int) -> None:
        self.shadow.labels(route_id, served, shadow, "yes" if agreed else "no").inc(jobs)

    def serve(self, host: str, port: int) -> Callable[[], None]:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the function that stops it.

        Raises:
            MetricsUnavailable: the address cannot be bound.
        """
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            raise MetricsUnavailable(host, port, err.strerror or str(err)) from None

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(5)

        return stop
