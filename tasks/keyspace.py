"""Every Redis key of one queue of one deployment, in one naming scheme: per model (``ModelKeys``, under the hash
tag ``{queue/model}``), the ingress (kombu's own lists of the queue), per queue and per deployment.

Results and what lives beside them per job are the result backend's keys (``swapless.tasks.broker.results``).
Plain data: building a ``Keyspace`` connects to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from swapless.config.settings import Settings
from swapless.tasks.protocol import PRIORITY_STEPS

__all__ = ["INGRESS", "JobLists", "Keyspace", "ModelKeys"]

_PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: "<queue>\x06\x16<priority>" above priority 0
#: The name the ingress's records go by in place of a model id (no model id can start with ``*``).
INGRESS = "*ingress"


@dataclass(frozen=True)
class JobLists:
    """A set of job lists, one per priority in serving order, and the records of the jobs fetched from them."""

    name: str
    lists: tuple[str, ...]
    held: str
    owner: str
    seen: str

    @property
    def records(self) -> list[str]:
        """``held``, ``owner``, ``seen``."""
        return [self.held, self.owner, self.seen]

    @property
    def queue_and_records(self) -> list[str]:
        """The keys of ``FETCH``, ``RESTORE`` and ``RECOVER`` (``swapless.tasks.broker.queues``)."""
        return [*self.lists, *self.records]


@dataclass(frozen=True)
class ModelKeys(JobLists):
    """The keys of one model under one queue."""

    holders: str = ""
    bell: str = ""

    @property
    def model_id(self) -> str:
        return self.name

    def list_for(self, priority: int) -> str:
        """The list the model's jobs of ``priority`` (one of ``PRIORITY_STEPS``) wait in."""
        return self.lists[PRIORITY_STEPS.index(priority)]


@dataclass(frozen=True)
class Keyspace:
    """The keys of one queue (``queue``) of one deployment (``prefix``, Redis keys' common prefix)."""

    queue: str
    prefix: str = ""

    @classmethod
    def of(cls, settings: Settings) -> Keyspace:
        """The keyspace of ``SWAPLESS_QUEUE`` under ``SWAPLESS_KEY_PREFIX``."""
        return cls(settings.jobs.queue, settings.jobs.key_prefix or "")

    def _tagged(self, name: str, part: str) -> str:
        return f"{self.prefix}swapless:{{{self.queue}/{name}}}:{part}"

    # -- per model and the ingress -----------------------------------------------------------------------------

    def model(self, model_id: str) -> ModelKeys:
        """The keys of ``model_id`` (its canonical id)."""
        part = lambda name: self._tagged(model_id, name)  # noqa: E731 - four lines shorter than a def
        return ModelKeys(model_id, tuple(part(f"p{p}") for p in PRIORITY_STEPS), part("held"), part("owner"),
                         part("seen"), part("holders"), part("bell"))

    def ingress(self, priority: int) -> str:
        """The ingress list of ``priority``, as kombu's Redis transport names it (``PRIORITY_STEPS``)."""
        base = f"{self.prefix}{self.queue}"
        return base if priority == 0 else f"{base}{_PRIORITY_SEP}{priority}"

    @property
    def ingress_lists(self) -> JobLists:
        """The ingress: kombu's lists of the queue, with records of their own."""
        return JobLists(INGRESS, tuple(self.ingress(p) for p in PRIORITY_STEPS), self._tagged(INGRESS, "held"),
                        self._tagged(INGRESS, "owner"), self._tagged(INGRESS, "seen"))

    # -- per queue ---------------------------------------------------------------------------------------------

    def _queue_key(self, name: str) -> str:
        return f"{self.prefix}swapless:{self.queue}:{name}"

    @property
    def placement_bell(self) -> str:
        """Rung by a producer whose job's model no worker holds."""
        return self._queue_key("placement-bell")

    def wake(self, worker_id: str) -> str:
        """A worker's own bell, rung by acks that free room for a model its waiting fetch skipped."""
        return self._queue_key(f"wake:{worker_id}")

    @property
    def routes(self) -> str:
        """Route id -> its run-time weights as JSON (``swapless route``)."""
        return self._queue_key("routes")

    @property
    def shadow_counts(self) -> str:
        """The hash of shadow agreement counts (``<route>|<served>|<shadow>|agree`` and ``...|total`` -> count)."""
        return self._queue_key("shadow")

    @property
    def webhooks_due(self) -> str:
        """The webhook deliveries waiting, scored by the time of their next attempt."""
        return self._queue_key("webhooks:due")

    def webhooks_owner(self, owner: str) -> str:
        """One API key's webhook deliveries waiting, scored by when each was queued."""
        return self._queue_key(f"webhooks:owner:{owner}")

    def webhook(self, delivery_id: str) -> str:
        """One webhook delivery, kept until it is delivered or failed."""
        return self._queue_key(f"webhook:{delivery_id}")

    @property
    def webhooks_failed(self) -> str:
        """The list of webhook deliveries that failed after their last retry, newest first."""
        return self._queue_key("webhooks:failed")

    # -- per deployment ----------------------------------------------------------------------------------------

    def heartbeat(self, worker_id: str) -> str:
        """One worker's heartbeat."""
        return f"{self.prefix}swapless:worker:{worker_id}"

    @property
    def heartbeats(self) -> str:
        """The sorted set of worker ids (score: the time of the last heartbeat)."""
        return f"{self.prefix}swapless:workers"

    def learned(self, device: str) -> str:
        """What workers on ``device`` learned of each model."""
        return f"{self.prefix}swapless:learned:{device}"

    @property
    def learned_devices(self) -> str:
        """The device kinds some worker learned on."""
        return f"{self.prefix}swapless:learned-devices"

    def gateway_inflight(self, owner: str) -> str:
        """The sorted set of one gateway caller's jobs in flight."""
        return f"{self.prefix}swapless:gateway:inflight:{owner}"

    @property
    def gateway_rate(self) -> str:
        """What the gateway's rate-limit keys start with."""
        return f"{self.prefix}swapless:gateway:rate"

    def batch(self, batch_id: str) -> str:
        """The hash of one batch's state (``swapless.tasks.gateway.batches.state``)."""
        return f"{self.prefix}swapless:batch:{batch_id}"

    def batch_lease(self, batch_id: str) -> str:
        """The lease of the process driving one batch."""
        return f"{self.prefix}swapless:batch:{batch_id}:lease"

    @property
    def batches(self) -> str:
        """The sorted set of every batch id (score: its creation time)."""
        return f"{self.prefix}swapless:batches"

    @property
    def active_batches(self) -> str:
        """The batch ids not in a final state yet."""
        return f"{self.prefix}swapless:batches:active"

    def owner_batches(self, owner: str) -> str:
        """One API key's batch ids, scored by creation time."""
        return f"{self.prefix}swapless:batches:owner:{owner}"

    def owner_files(self, owner: str) -> str:
        """One API key's batch files: file id -> ``"<created_at> <bytes>"``."""
        return f"{self.prefix}swapless:files:owner:{owner}"
