"""Driving one batch to its end on the bulk machinery: ``BatchDriver.run`` (validating, in progress, finalizing)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pydantic_core import to_json

from swapless.config.errors import DeadlinePassed, InputError
from swapless.config.settings import Settings
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore
from swapless.tasks.client.bulk import BulkJob, BulkRun, ChunkSource
from swapless.tasks.client.progress import NullProgress
from swapless.tasks.gateway.auth import Caller
from swapless.tasks.gateway.batches.files import FileStore
from swapless.tasks.gateway.batches.lines import parse_line
from swapless.tasks.gateway.batches.owners import OwnerIndex
from swapless.tasks.gateway.batches.shaping import Shaper
from swapless.tasks.gateway.batches.state import BatchStatus, BatchStore, public_batch
from swapless.tasks.gateway.errors import BadBatchFile
from swapless.tasks.gateway.keys import KeyRule
from swapless.tasks.gateway.plane import check_input
from swapless.tasks.tracing import working
from swapless.tasks.webhooks import WebhookDelivery, WebhookQueue

__all__ = ["BatchDriver", "LeaseLost", "Stopped", "file_id_for"]

logger = logging.getLogger(__name__)

_CANCEL_CHECK_S = 0.5


class LeaseLost(Exception):
    """This process no longer holds the batch's lease: another runner drives it now."""


class Stopped(Exception):
    """This process is stopping: the batch is left for the next runner, which resumes it."""


class _Cancelled(Exception):
    pass


def file_id_for(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: fixed per batch, so a finalizing redone replaces, never adds."""
    return "file-" + hashlib.blake2b(f"{batch_id}\0{kind}".encode(), digest_size=12).hexdigest()


@dataclass(frozen=True)
class _Group:
    model: str
    priority: str
    index: int

    @property
    def input_name(self) -> str:
        return f"in-{self.index}.jsonl"

    @property
    def output_name(self) -> str:
        return f"out-{self.index}.jsonl"


class _Counts(NullProgress):
    """A bulk run's progress as the batch's counts in Redis; each chunk's lines are shaped as they come."""

    def __init__(self, driver: BatchDriver, ok: int, failed: int, shaper: Shaper, group: _Group) -> None:
        self.driver, self.ok, self.failed, self.shaper, self.group = driver, ok, failed, shaper, group

    def update(self, records: int, failed: int) -> None:
        self.driver.store.update(self.driver.batch_id, completed=self.ok + records - failed,
                                 failed=self.failed + failed)
        self.shaper.catch_up(self.group.index, self.group.model, self.group.output_name)
        self.driver.check()


class BatchDriver:
    """Drives one batch whose lease ``runner_id`` holds.

    Args:
        batch_id: the batch.
        store: the batches' state.
        files: the file store.
        client: the producer the chunks go through.
        models: the models file.
        settings: the process's settings.
        work_dir: this batch's work directory.
        runner_id: the lease holder's id.
        stop: set when the process stops.
        max_in_flight: chunks in flight per group.
    """

    def __init__(self, batch_id: str, store: BatchStore, files: FileStore, client: ChunkSource, models: ModelStore,
                 settings: Settings, work_dir: Path, runner_id: str, stop: threading.Event,
                 max_in_flight: int = 8) -> None:
        self.batch_id, self.store, self.files, self.client = batch_id, store, files, client
        self.models, self.settings, self.work, self.runner_id = models, settings, work_dir, runner_id
        self.stop, self.max_in_flight = stop, max_in_flight
        self._renewed = self._looked = time.monotonic()
        self._shaper = Shaper(batch_id, work_dir)
        self._decided: dict[str, tuple[str, tuple[str, str, int] | None, ModelSpec | None]] = {}

    def check(self) -> None:
        """Renew the lease every third of it, and look for a cancel.

        Raises:
            LeaseLost, Stopped: stop driving now (the output so far stays for the next driver).
        """
        now = time.monotonic()
        if self.stop.is_set():
            raise Stopped
        if now - self._renewed >= self.settings.batches.batch_lease_s / 3:
            if not self.store.renew_lease(self.batch_id, self.runner_id, self.settings.batches.batch_lease_s):
                raise LeaseLost
            self._renewed = now
        if now - self._looked >= _CANCEL_CHECK_S:
            self._looked = now
            batch = self.store.get(self.batch_id)
            if batch is None or batch.get("status") == BatchStatus.CANCELLING.value:
                raise _Cancelled

    def run(self) -> None:
        """Drive the batch from where it stands to a final status, in the batch's one trace.

        Raises:
            LeaseLost, Stopped: as ``check``.
        """
        batch = self.store.get(self.batch_id)
        if batch is None:
            return
        kept = batch.get("traceparent") or None
        with working(f"batch {self.batch_id}", {"swapless.batch.id": self.batch_id}, kept) as traceparent:
            if traceparent is not None and kept is None:
                self.store.update(self.batch_id, traceparent=traceparent)
            self._drive(batch)

    def _drive(self, batch: dict[str, str]) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            if batch["status"] == BatchStatus.CANCELLING.value:
                raise _Cancelled
            groups = self._plan(batch)
            self.store.set_status(self.batch_id, BatchStatus.IN_PROGRESS)
            ending = self._run_groups(groups, datetime.fromtimestamp(int(batch["expires_at"]), UTC))
        except _Cancelled:
            ending = BatchStatus.CANCELLED
            groups = self._groups() or []
        except _InputGone as gone:
            self.store.update(self.batch_id, errors=json.dumps([{"code": "input_file_missing", "message": str(gone),
                                                                  "param": "input_file_id", "line": None}]))
            self._end(BatchStatus.FAILED)
            return
        self._finalize(groups, ending)

    # -- validating --------------------------------------------------------------------------------------------

    def _groups(self) -> list[_Group] | None:
        try:
            plan = json.loads((self.work / "plan.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return [_Group(g["model"], g["priority"], i) for i, g in enumerate(plan["groups"])]

    def _plan(self, batch: dict[str, str]) -> list[_Group]:
        found = self._groups()
        if found is not None:
            return found
        caller = _caller(batch)
        groups: dict[tuple[str, str], tuple[_Group, IO[bytes]]] = {}
        total = 0
        prefailed = (self.work / "prefailed.jsonl").open("wb")
        try:
            for number, raw in self._input_lines(batch["input_file_id"]):
                total += 1
                if total % 1000 == 0:
                    self.check()
                custom_id, model, priority, value, key, refusal = self._decide(raw, number, caller)
                if refusal is not None:
                    prefailed.write(_bulk_failure(custom_id, *refusal))
                    continue
                if (model, priority) not in groups:
                    group = _Group(model, priority, len(groups))
                    groups[model, priority] = (group, (self.work / group.input_name).open("wb"))
                record = {"custom_id": custom_id, "input": value, "key": key}
                groups[model, priority][1].write(to_json(record) + b"\n")
        finally:
            for file in [prefailed, *(out for _, out in groups.values())]:
                file.flush()
                os.fsync(file.fileno())
                file.close()
        ordered = [group for group, _ in groups.values()]
        plan = {"total": total, "groups": [{"model": g.model, "priority": g.priority} for g in ordered]}
        (self.work / "plan.tmp").write_text(json.dumps(plan))
        os.replace(self.work / "plan.tmp", self.work / "plan.json")
        failed = _count_lines(self.work / "prefailed.jsonl")
        self.store.update(self.batch_id, total=total, failed=failed, completed=0)
        return ordered

    def _input_lines(self, file_id: str) -> Iterator[tuple[int, bytes]]:
        try:
            source = self.files.open(file_id)
        except FileNotFoundError:
            raise _InputGone(f"the input file {file_id} is gone (deleted, or past its retention)") from None
        with source:
            for number, line in enumerate(source, start=1):
                if line.strip():
                    yield number, line

    def _decide(self, raw: bytes, number: int, caller: Caller) -> tuple[str, str, str, Any, str | None,
                                                                      tuple[str, str, int] | None]:
        """A line's custom id, model, priority, input and key, and why it fails at once (type, message, status)."""
        try:
            line = parse_line(raw, number)
        except BadBatchFile as err:
            return f"line-{number}", "", "", None, None, ("BadBatchFile", str(err), 400)
        if line.error is not None:  # its body would be refused by /predict: this request fails alone
            return line.custom_id, "", "", None, None, ("InvalidRequest", line.error, 400)
        model, refusal, spec = self._model(line.model_id, caller)
        if refusal is None and spec is not None:
            try:
                check_input(spec, line.input, self.settings.inputs)
            except InputError as err:
                refusal = ("InputError", str(err), 422)
        return line.custom_id, model, line.priority, line.input, line.key, refusal

    def _model(self, name: str, caller: Caller) -> tuple[str, tuple[str, str, int] | None, ModelSpec | None]:
        """What lines naming ``name`` run on: (model or route, why they all fail, the spec to check inputs against)."""
        known = self._decided.get(name)
        if known is not None:
            return known
        decided: tuple[str, tuple[str, str, int] | None, ModelSpec | None]
        if not caller.may_call(self.models, name):
            decided = (name, ("ModelForbidden", caller.refusal(name), 403), None)
        elif self.models.is_route(name):
            decided = (name, None, None)
        elif name not in self.models:
            listed = ", ".join(self.models.ids())
            decided = (name, ("UnknownModel", f"unknown model {name!r} (known: {listed})", 404), None)
        else:
            resolved = self.models.resolve(name)
            decided = (resolved, None, self.models.get(resolved))
        self._decided[name] = decided
        return decided

    # -- in progress -------------------------------------------------------------------------------------------

    def _run_groups(self, groups: list[_Group], deadline: datetime) -> BatchStatus:
        ok = 0
        failed = _count_lines(self.work / "prefailed.jsonl")
        self._shaper.start()
        for group in groups:
            job = BulkJob(group.model, self.work / group.input_name, self.work / group.output_name, field="input",
                          id_field="custom_id", key_field="key", fmt="jsonl", priority=group.priority,
                          max_in_flight=self.max_in_flight, expires=deadline)
            progress = _Counts(self, ok, failed, self._shaper, group)
            run = BulkRun(job, self.client, progress=progress, watchdog=self.check)
            try:
                summary = run.run()
            except DeadlinePassed:
                return BatchStatus.EXPIRED
            ok += summary.ok
            failed += summary.failed
        return BatchStatus.COMPLETED

    # -- finalizing --------------------------------------------------------------------------------------------

    def _finalize(self, groups: list[_Group], ending: BatchStatus) -> None:
        if ending is not BatchStatus.CANCELLED:
            self.store.set_status(self.batch_id, BatchStatus.FINALIZING)
        shaper = self._shaper
        try:
            shaper.ensure_started()
            for group in groups:
                done = shaper.catch_up(group.index, group.model, group.output_name)
                if ending is BatchStatus.EXPIRED:
                    shaper.expired(group.input_name, done)
        finally:
            shaper.close()
        batch = self.store.get(self.batch_id) or {}
        owner = batch.get("owner", "")
        fields: dict[str, Any] = {"completed": shaper.ok, "failed": shaper.failed}
        for path, kind, field in ((shaper.out_path, "output", "output_file_id"),
                                  (shaper.err_path, "errors", "error_file_id")):
            if path.stat().st_size:
                file_id = file_id_for(self.batch_id, kind)
                info = self.files.put(path, file_id=file_id, filename=f"{self.batch_id}_{kind}.jsonl",
                                      purpose="batch_output", owner=owner, move=True)
                OwnerIndex(self.store.redis, self.store.keys, self.settings.batches).add_file(owner, file_id,
                                                                                     info.created_at, info.bytes)
                fields[field] = file_id
        self.store.update(self.batch_id, **fields)
        self._end(ending)

    def _end(self, ending: BatchStatus) -> None:
        self.store.set_status(self.batch_id, ending)
        shutil.rmtree(self.work, ignore_errors=True)
        logger.info("batch %s %s", self.batch_id, ending.value)
        self._announce(ending)

    def _announce(self, ending: BatchStatus) -> None:
        """Queue the batch's end webhook, one id per batch and ending, so a redone ending is not sent twice."""
        batch = self.store.get(self.batch_id) or {}
        url = batch.get("callback_url") or self.settings.batches.batch_webhook_url
        if not url:
            return
        event_id = "evt_" + hashlib.blake2b(f"{self.batch_id}\0{ending.value}".encode(), digest_size=12).hexdigest()
        public = public_batch(batch, self.batch_id)
        data = {name: public[name] for name in ("id", "status", "request_counts", "output_file_id", "error_file_id",
                                                 "metadata")}
        payload = json.dumps({"object": "event", "id": event_id, "type": f"batch.{ending.value}",
                              "created_at": int(time.time()), "data": data})
        try:
            owner = batch.get("owner") if batch.get("callback_url") else None  # the deployment's own URL: no key's
            delivery = WebhookDelivery(event_id, url, payload, owner=owner)
            WebhookQueue.of(self.store.redis, self.settings).enqueue([delivery])
        except Exception:  # the batch's end stands; its webhook is what is lost, and the log says so
            logger.exception("could not queue the end webhook of batch %s", self.batch_id)


class _InputGone(Exception):
    pass


def _caller(batch: dict[str, str]) -> Caller:
    """The batch's creator as the gateway knew it (its key's models, as recorded with the batch)."""
    models = json.loads(batch["models"]) if batch.get("models") else None
    if models is None:
        return Caller(batch.get("owner", ""), admin=True)
    names = tuple(json.loads(batch.get("model_names") or "[]"))
    return Caller(batch.get("owner", ""), admin=False, rule=KeyRule(b"", frozenset(models), names))


def _bulk_failure(custom_id: str, type_name: str, message: str, status: int) -> bytes:
    record = {"ok": False, "key": custom_id, "error": message, "type": type_name, "status": status}
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as file:
            return sum(1 for _ in file)
    except FileNotFoundError:
        return 0
