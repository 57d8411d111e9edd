"""The batch API under ``/v1`` in the shape of OpenAI's Files and Batch APIs: ``BatchEndpoints`` and its route table.

The ``openai`` client works unchanged with ``OpenAI(base_url="http://host:8000/v1", api_key=KEY)``.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from swapless.config.settings import Settings
from swapless.manager.registry.store import ModelStore
from swapless.tasks.broker.connection import redis_client
from swapless.tasks.broker.sentinel import SentinelOptions
from swapless.tasks.gateway.auth import Caller, Need, needs
from swapless.tasks.gateway.batches.files import FileInfo, FileStore, new_file_id
from swapless.tasks.gateway.batches.lines import ENDPOINT, LineChecker
from swapless.tasks.gateway.batches.owners import OwnerIndex
from swapless.tasks.gateway.batches.runner import work_root
from swapless.tasks.gateway.batches.state import FINAL, BatchStatus, BatchStore, new_batch_id, public_batch
from swapless.tasks.gateway.batches.upload import LineWriter, MultipartReader, boundary_of
from swapless.tasks.gateway.errors import BadBatch, BadBatchFile, UnknownBatch, UnknownFile
from swapless.tasks.gateway.http import Route, router_of
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.tracing import current_traceparent
from swapless.tasks.webhooks import allowed_hosts, check_target

__all__ = ["BATCH_ROUTES", "BatchEndpoints", "BatchRequest", "batch_router", "parse_window"]

#: Bytes of an upload's envelope beside its file (the multipart headers, the purpose field).
UPLOAD_ENVELOPE_BYTES = 64 * 1024
_WINDOW = re.compile(r"([0-9]{1,7})([smh])")
_ID = r"^[A-Za-z0-9_-]{1,128}$"


#: OpenAI's limits on a batch's metadata: 16 pairs, keys of 64 characters, values of 512.
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class BatchRequest(BaseModel):
    """``POST /v1/batches``'s body."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=128, pattern=_ID)
    endpoint: Literal["/predict"]
    completion_window: str = Field("24h", max_length=16, description="24h, or a shorter 90m or 30s")
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        None, max_length=16, description="at most 16 pairs, keys of 64 characters, values of 512 (OpenAI's limits)")
    callback_url: str | None = Field(None, max_length=2048,
                                     description="where the batch's end is posted (openai: extra_body)")


def parse_window(text: str, max_s: int) -> int:
    """A completion window (``24h``, ``90m``, ``30s``) in seconds.

    Raises:
        BadBatch: not one, or over ``SWAPLESS_BATCH_MAX_WINDOW_S``.
    """
    found = _WINDOW.fullmatch(text)
    if found is None:
        raise BadBatch(f"completion_window must be a duration like 24h, 90m or 30s, not {text!r}")
    seconds = int(found.group(1)) * {"s": 1, "m": 60, "h": 3600}[found.group(2)]
    if not 0 < seconds <= max_s:
        raise BadBatch(f"completion_window {text!r} is not between 1 s and {max_s} s (SWAPLESS_BATCH_MAX_WINDOW_S)")
    return seconds


def _page(found: list[FileInfo], after: str | None, limit: int) -> dict[str, Any]:
    """A list object of the files after the one of id ``after``, at most ``limit`` of them."""
    if after is not None:
        ids = [info.id for info in found]
        found = found[ids.index(after) + 1 :] if after in ids else []
    page = found[:limit]
    return {"object": "list", "data": [info.public() for info in page], "has_more": len(found) > limit,
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None}


def _caller_of(request: Request) -> Caller:
    caller: Caller = request.state.caller
    return caller


class BatchEndpoints:
    """The ``/v1`` handlers over the batch API's stores.

    Args:
        settings: the deployment's settings.
        models: the models file.
        max_line_bytes: the longest line of an input file.
    """

    def __init__(self, settings: Settings, models: ModelStore, max_line_bytes: int) -> None:
        self.settings = settings
        self.max_line_bytes = max_line_bytes
        self.files = FileStore.of(settings.batches)
        redis = settings.redis
        self.store = BatchStore(redis_client(redis.broker_url, connect_timeout_s=redis.connect_timeout_s,
                                             sentinel=SentinelOptions.of(settings)), Keyspace.of(settings),
                                settings.batches.batch_retention_s, settings.batches.batch_max_window_s)
        self.uploads = work_root(settings.batches, self.files) / "uploads"
        self.owners = OwnerIndex(self.store.redis, self.store.keys, settings.batches)

    def _files_of(self, caller: Caller) -> list[FileInfo]:
        """The caller's files, newest first: from its own index (an operator: every file)."""
        if caller.admin:
            return self.files.list()
        found = []
        for entry in self.owners.files(caller.owner):
            info = self.files.info(entry.file_id)
            if info is None:  # deleted or expired: the index follows
                self.owners.remove_file(caller.owner, entry.file_id)
            elif info.owner == caller.owner:
                found.append(info)
        return found

    def _batches_of(self, caller: Caller, after: str | None, limit: int) -> tuple[list[dict[str, str]], bool]:
        """A page of the caller's batches, newest first, after ``after`` (an operator: every batch)."""
        if caller.admin:
            return self.store.page(after, limit, None)
        ids = self.owners.batch_ids(caller.owner)
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        found: list[dict[str, str]] = []
        for batch_id in ids:
            batch = self.store.get(batch_id)
            if batch is not None and batch.get("owner") == caller.owner:
                batch["id"] = batch_id
                found.append(batch)
                if len(found) > limit:
                    break
        return found[:limit], len(found) > limit

    async def _own_file(self, caller: Caller, file_id: str) -> FileInfo:
        info = await asyncio.to_thread(self.files.info, file_id)
        if info is None or (info.owner != caller.owner and not caller.admin):
            raise UnknownFile(file_id)
        return info

    async def _own_batch(self, caller: Caller, batch_id: str) -> dict[str, str]:
        batch = await asyncio.to_thread(self.store.get, batch_id)
        if batch is None or (batch.get("owner") != caller.owner and not caller.admin):
            raise UnknownBatch(batch_id)
        return batch

    async def _spool(self, request: Request, caller: Caller, boundary: bytes, spool: Any) -> FileInfo:
        """Stream the upload into ``spool``, checking each line, then store it as the caller's file."""
        checker = LineChecker(self.settings.batches.batch_max_lines, self.max_line_bytes)
        upload = await MultipartReader(boundary, "file", LineWriter(spool, checker)).read(request.stream())
        purpose = upload.fields.get("purpose")
        if purpose != "batch":
            raise BadBatchFile(0, f"purpose must be 'batch', not {purpose!r}")
        if checker.lines == 0:
            raise BadBatchFile(0, "the file holds no request: one JSON line per request")
        spool.flush()
        await asyncio.to_thread(self.owners.check_file, caller.owner, Path(spool.name).stat().st_size)
        return await asyncio.to_thread(self.files.put, Path(spool.name), file_id=new_file_id(),
                                       filename=(upload.filename or "input.jsonl")[:256], purpose="batch",
                                       owner=caller.owner, lines=checker.lines)

    async def upload_file(self, request: Request) -> dict[str, Any]:
        """Upload a batch input file (multipart: ``purpose=batch`` and ``file``), checked line by line as it comes:
        a bad line refuses the file with its line number (400)."""
        caller = _caller_of(request)
        boundary = boundary_of(request.headers.get("content-type", ""))
        if request.headers.get("content-encoding", "identity").lower() != "identity":
            raise BadBatchFile(0, "send the file uncompressed (no Content-Encoding)")
        await asyncio.to_thread(self.owners.check_file, caller.owner, 0)  # at its file count already: read nothing
        self.uploads.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.uploads, suffix=".jsonl") as spool:
            info = await self._spool(request, caller, boundary, spool)
            await asyncio.to_thread(self.owners.add_file, caller.owner, info.id, info.created_at, info.bytes)
        return info.public()

    async def list_files(self, request: Request, purpose: str | None = Query(None, max_length=32),
                         after: str | None = Query(None, pattern=_ID),
                         limit: int = Query(10_000, ge=1, le=10_000)) -> dict[str, Any]:
        """This key's files, newest first."""
        caller = _caller_of(request)
        found = [info for info in await asyncio.to_thread(self._files_of, caller)
                 if purpose is None or info.purpose == purpose]
        return _page(found, after, limit)

    async def get_file(self, request: Request, file_id: str) -> dict[str, Any]:
        """A file object."""
        return (await self._own_file(_caller_of(request), file_id)).public()

    async def file_content(self, request: Request, file_id: str) -> StreamingResponse:
        """A file's bytes (JSON Lines), streamed."""
        info = await self._own_file(_caller_of(request), file_id)
        return StreamingResponse(self.files.chunks(info.id), media_type="application/jsonl",
                                 headers={"Content-Length": str(info.bytes)})

    async def delete_file(self, request: Request, file_id: str) -> dict[str, Any]:
        """Delete a file."""
        info = await self._own_file(_caller_of(request), file_id)
        await asyncio.to_thread(self.files.delete, info.id)
        await asyncio.to_thread(self.owners.remove_file, info.owner, info.id)
        return {"id": info.id, "object": "file", "deleted": True}

    async def create_batch(self, request: Request, body: BatchRequest) -> dict[str, Any]:
        """Create a batch over an uploaded file: it is validated, run at its lines' priority (bulk by default) and
        finalized into an output file and an error file."""
        settings = self.settings
        caller = _caller_of(request)
        info = await self._own_file(caller, body.input_file_id)
        if info.purpose != "batch":
            raise BadBatch(f"file {info.id} is a {info.purpose} file, not an input: upload one with purpose=batch")
        window_s = parse_window(body.completion_window, settings.batches.batch_max_window_s)
        if body.callback_url is not None:
            check_target(body.callback_url, allowed_hosts(settings.webhooks.webhook_allowed_hosts))
        await asyncio.to_thread(self.owners.check_batch, caller.owner)
        rule = caller.rule
        batch_id = new_batch_id()
        fields: dict[str, Any] = {
            "owner": caller.owner, "input_file_id": info.id, "endpoint": ENDPOINT,
            "completion_window": body.completion_window, "expires_at": int(time.time()) + window_s,
            "total": info.lines, "completed": 0, "failed": 0, "metadata": body.metadata,
            "callback_url": body.callback_url,
            "models": sorted(rule.models) if rule is not None and rule.models is not None else None,
            "model_names": list(rule.names) if rule is not None else None,
            "traceparent": current_traceparent(),  # the batch's chunks go on in its creator's trace
        }
        await asyncio.to_thread(self.store.create, batch_id, fields)
        await asyncio.to_thread(self.owners.add_batch, caller.owner, batch_id, time.time())
        return public_batch(await self._own_batch(caller, batch_id), batch_id)

    async def list_batches(self, request: Request, after: str | None = Query(None, pattern=_ID),
                           limit: int = Query(20, ge=1, le=100)) -> dict[str, Any]:
        """This key's batches, newest first, ``limit`` a page; the next page is ``after`` the page's ``last_id``."""
        caller = _caller_of(request)
        found, more = await asyncio.to_thread(self._batches_of, caller, after, limit)
        data = [public_batch(batch, batch["id"]) for batch in found]
        return {"object": "list", "data": data, "has_more": more,
                "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}

    async def get_batch(self, request: Request, batch_id: str) -> dict[str, Any]:
        """A batch object: its status, request counts, file ids and timestamps."""
        return public_batch(await self._own_batch(_caller_of(request), batch_id), batch_id)

    async def cancel_batch(self, request: Request, batch_id: str) -> dict[str, Any]:
        """Cancel a batch: ``cancelling`` until its driver stops it, then ``cancelled``, with the requests done so
        far in its output and error files and counts. A finished batch answers 409."""
        caller = _caller_of(request)
        await self._own_batch(caller, batch_id)
        now = await asyncio.to_thread(self.store.set_status, batch_id, BatchStatus.CANCELLING)
        if now in FINAL and now is not BatchStatus.CANCELLED:
            raise BadBatch(f"batch {batch_id} is {now.value if now else 'gone'}: only a batch not finished yet can "
                           "be cancelled", conflict=True)
        return public_batch(await self._own_batch(caller, batch_id), batch_id)


BATCH_ROUTES = [
    Route("/files", "upload_file", ("POST",), needs(Need.KEY)),
    Route("/files", "list_files", ("GET",), needs(Need.KEY)),
    Route("/files/{file_id}", "get_file", ("GET",), needs(Need.KEY)),
    Route("/files/{file_id}/content", "file_content", ("GET",), needs(Need.KEY)),
    Route("/files/{file_id}", "delete_file", ("DELETE",), needs(Need.KEY)),
    Route("/batches", "create_batch", ("POST",), needs(Need.KEY)),
    Route("/batches", "list_batches", ("GET",), needs(Need.KEY)),
    Route("/batches/{batch_id}", "get_batch", ("GET",), needs(Need.KEY)),
    Route("/batches/{batch_id}/cancel", "cancel_batch", ("POST",), needs(Need.KEY)),
]


def batch_router(settings: Settings, models: ModelStore, max_line_bytes: int) -> APIRouter:
    """The ``/v1`` routes (``BatchEndpoints``' arguments)."""
    return router_of(BatchEndpoints(settings, models, max_line_bytes), BATCH_ROUTES, prefix="/v1")
