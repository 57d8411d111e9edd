"""A web app that classifies reviews through Swapless: submit and poll later, or submit and await the labels.

Run it beside a worker, on the same Redis (``SWAPLESS_REDIS_URL``) and models file::

    uvicorn examples.webapp.app:app --port 8080

- ``POST /reviews`` queues a review and answers ``202`` with the job id at once;
- ``GET /reviews/{job_id}`` polls: ``pending``, ``done`` with the labels, or ``failed`` with the error;
- ``POST /reviews/classify`` queues a review and awaits its labels (``504`` with the job id after 10 s: poll it).

The producer is one ``swapless.Client`` per process, built when the app starts: its Redis connections and its one
result listener serve every request. Handlers that wait are ``async`` and wait with ``Job.aget``, which holds no
event-loop time; the others are plain functions, which FastAPI runs in its thread pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from swapless import Client, InputError, JobTimeout, SwaplessError

#: The model every review goes to: an id or alias of the models file.
MODEL = "sentiment"
#: How long ``POST /reviews/classify`` waits for the labels before it answers 504 with the job id.
WAIT_S = 10.0


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.swapless = Client()  # SWAPLESS_REDIS_URL, else redis://127.0.0.1:6379/0
    try:
        yield
    finally:
        app.state.swapless.close()


app = FastAPI(title="Reviews", lifespan=lifespan)


class Review(BaseModel):
    text: str = Field(min_length=1, max_length=10_000)


def _client(request: Request) -> Client:
    client: Client = request.app.state.swapless
    return client


@app.post("/reviews", status_code=202)
def submit(review: Review, request: Request) -> dict[str, str]:
    """Queue the review; answer at once with the job id to poll."""
    job = _client(request).submit(MODEL, review.text)
    return {"job_id": job.id}


@app.get("/reviews/{job_id}")
def poll(job_id: str, request: Request) -> dict[str, Any]:
    """The job's state now: pending (queued or running), done with its labels, or failed with the error."""
    status = _client(request).job(job_id).status()
    if not status.ready:
        return {"job_id": job_id, "state": "pending"}
    if isinstance(status.value, SwaplessError):
        return {"job_id": job_id, "state": "failed", "error": str(status.value)}
    return {"job_id": job_id, "state": "done", "labels": status.value}


@app.post("/reviews/classify")
async def classify(review: Review, request: Request) -> dict[str, Any]:
    """Queue the review and await its labels; after ``WAIT_S`` answer 504 with the job id, to poll."""
    job = _client(request).submit(MODEL, review.text)
    try:
        labels = await job.aget(timeout=WAIT_S)
    except JobTimeout:
        raise HTTPException(504, {"job_id": job.id, "poll": f"/reviews/{job.id}"}) from None
    except InputError as err:
        raise HTTPException(422, str(err)) from None
    return {"job_id": job.id, "labels": labels}
