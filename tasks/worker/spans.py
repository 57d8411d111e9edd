"""BatchSpans: where each traced job's time went, in its producer's trace (docs/guides/tracing.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from swapless.manager import Job, ModelManager, Outcome
from swapless.tasks.tracing import MESSAGING_SYSTEM, remote_parent, trace_id_of

__all__ = ["BatchSpans", "BatchTrace", "traces_note"]

logger = logging.getLogger(__name__)

#: Trace ids a log line names at most.
NOTE_TRACES = 3


def traces_note(jobs: Sequence[Job]) -> str:
    """What a log line about ``jobs`` says of their producers' traces (``""`` when none carried one)."""
    seen = dict.fromkeys(job.trace for job in jobs if job.trace is not None)
    if not seen:
        return ""
    ids = [i for i in dict.fromkeys(trace_id_of(t) for t in seen) if i is not None]
    if not ids:
        return ""
    shown = ", ".join(ids[:NOTE_TRACES]) + (f" and {len(ids) - NOTE_TRACES} more" if len(ids) > NOTE_TRACES else "")
    return f" [trace{'s' if len(ids) > 1 else ''} {shown}]"


class BatchSpans:
    """Makes the spans of the batches one worker runs.

    Args:
        tracer: an OpenTelemetry tracer.
        queue: the worker's queue (``messaging.destination.name``).
    """

    def __init__(self, tracer: Any, queue: str) -> None:
        self.tracer = tracer
        self.queue = queue

    def start(self, model_id: str, batch: Sequence[Job], manager: ModelManager) -> BatchTrace | None:
        """Mark a batch's start (called as it starts); None when none of its jobs is traced."""
        traces: dict[str, list[Job]] = {}
        for job in batch:
            if job.trace is not None:
                traces.setdefault(job.trace, []).append(job)
        return BatchTrace(self, model_id, len(batch), traces, manager) if traces else None


class BatchTrace:
    """The marks of one batch, and its spans made from them (``stored``). Never raises."""

    def __init__(self, spans: BatchSpans, model_id: str, size: int, traces: dict[str, list[Job]],
                 manager: ModelManager) -> None:
        self.spans = spans
        self.model_id = model_id
        self.size = size
        self.traces = traces
        self.manager = manager
        self.started_ns = time.time_ns()
        self._wall_minus_mono = time.time() - time.monotonic()
        self._loads, self._swaps = self._load_counts()
        self.loaded_ns: int | None = None
        self.ended_ns: int | None = None
        self.load = "none"
        self.failed: set[str] = set()

    def _load_counts(self) -> tuple[int, int]:
        stats = self.manager.stats
        return len(stats.load_seconds.get(self.model_id, ())), len(stats.swap_in_seconds.get(self.model_id, ()))

    def on_loaded(self, then: Callable[[], None] | None) -> Callable[[], None]:
        """The ``on_loaded`` hook of the batch's run: marks the model loaded, then calls ``then``."""

        def loaded() -> None:
            self.loaded_ns = time.time_ns()
            if then is not None:
                then()

        return loaded

    def ran(self, outcomes: Sequence[Outcome]) -> None:
        """Mark the batch's end (called once it ran, on the scheduler thread)."""
        self.ended_ns = time.time_ns()
        loads, swaps = self._load_counts()
        self.load = "disk" if loads > self._loads else "host" if swaps > self._swaps else "none"
        self.failed = {o.job.id for o in outcomes if o.error is not None}

    def stored(self, begun_ns: int | None, done_ns: int | None) -> None:
        """Make the batch's spans, its results stored from ``begun_ns`` to ``done_ns`` (None: it stored nothing,
        its jobs being items of chunks not yet whole)."""
        try:
            self._emit(begun_ns, done_ns)
        except Exception:  # spans must never cost a job its result
            logger.exception("could not make the spans of a batch of %s", self.model_id)

    def _sent_ns(self, jobs: Sequence[Job]) -> int:
        """When the first of ``jobs`` was sent (its producer's stamp, else its receipt), on the wall clock."""
        return int((min(job.received_s for job in jobs) + self._wall_minus_mono) * 1e9)

    def _emit(self, begun_ns: int | None, stored_ns: int | None) -> None:
        from opentelemetry import context, trace

        tracer, model = self.spans.tracer, self.model_id
        done_ns = stored_ns or self.ended_ns or time.time_ns()
        parents = {tp: remote_parent(tp) for tp in self.traces}
        run_attributes = {
            "swapless.model.id": model,
            "swapless.batch.size": self.size,
            "swapless.batch.traces": len(self.traces),
            "swapless.load": self.load,
            "swapless.batch.failed": len(self.failed),
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.destination.name": self.spans.queue,
        }
        alone = len(self.traces) == 1
        process: dict[str, Any] = {}
        if alone:
            (tp, jobs), = self.traces.items()
            process[tp] = self._process(tracer, tp, jobs, parents[tp], [])
            run_parent = trace.set_span_in_context(process[tp])
            links = []
        else:
            run_parent = context.Context()  # a trace of its own, linked to every producer's
            links = [trace.Link(trace.get_current_span(ctx).get_span_context()) for ctx in parents.values()]
        run = tracer.start_span(f"run {model}", context=run_parent, attributes=run_attributes, links=links,
                                start_time=self.started_ns)
        inside = trace.set_span_in_context(run)
        loaded = self.loaded_ns if self.loaded_ns is not None else self.ended_ns
        if self.load != "none" and self.loaded_ns is not None:
            tracer.start_span(f"load {model}", context=inside, start_time=self.started_ns,
                              attributes={"swapless.model.id": model, "swapless.load.source": self.load}
                              ).end(end_time=self.loaded_ns)
        if self.loaded_ns is not None and self.ended_ns is not None:
            tracer.start_span(f"forward {model}", context=inside, start_time=loaded,
                              attributes={"swapless.model.id": model, "swapless.batch.size": self.size}
                              ).end(end_time=self.ended_ns)
        if begun_ns is not None:
            tracer.start_span(f"store {model}", context=inside, start_time=begun_ns,
                              attributes={"swapless.model.id": model, "swapless.batch.size": self.size}
                              ).end(end_time=done_ns)
        if self.failed and len(self.failed) == self.size:
            run.set_status(trace.StatusCode.ERROR, f"all {self.size} job(s) failed")
        run.end(end_time=done_ns)
        if not alone:
            link = [trace.Link(run.get_span_context())]
            for tp, jobs in self.traces.items():
                process[tp] = self._process(tracer, tp, jobs, parents[tp], link)
        for span in process.values():
            span.end(end_time=done_ns)

    def _process(self, tracer: Any, traceparent: str, jobs: list[Job], parent: Any, links: list[Any]) -> Any:
        """A trace's ``process`` span (left open) and its ``wait`` span."""
        from opentelemetry import trace

        sent_ns = min(self._sent_ns(jobs), self.started_ns)
        attributes: dict[str, Any] = {  # the batch's own (size, load) are on its run span, linked
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": self.spans.queue,
            "swapless.model.id": self.model_id,
        }
        if len(jobs) == 1:
            attributes["messaging.message.id"] = jobs[0].id
        else:
            attributes["messaging.batch.message_count"] = len(jobs)
        span = tracer.start_span(f"process {self.model_id}", context=parent, kind=trace.SpanKind.CONSUMER,
                                 attributes=attributes, links=links, start_time=sent_ns)
        failed = sum(1 for job in jobs if job.id in self.failed)
        if failed:
            span.set_status(trace.StatusCode.ERROR, f"{failed} of {len(jobs)} job(s) failed")
        tracer.start_span(f"wait {self.model_id}", context=trace.set_span_in_context(span), start_time=sent_ns
                          ).end(end_time=self.started_ns)
        return span
