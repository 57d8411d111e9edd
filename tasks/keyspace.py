"""Every Redis key of one queue of one deployment, in one place and one naming scheme.

``Keyspace(queue, prefix)`` (``Keyspace.of(settings)``: ``SWAPLESS_QUEUE`` under ``SWAPLESS_KEY_PREFIX``) names:

- per **model** (``ModelKeys``), under the hash tag ``{queue/model}`` (one Redis Cluster slot per model, so each
  script over one model's keys could run on a cluster unchanged): ``p0 p3 p6 p9`` the jobs waiting by priority,
  ``held`` / ``owner`` / ``seen`` the jobs workers fetched and have not acked, ``holders`` the workers' claims,
  ``bell`` a one-token list producers ring. Swapless's producers push here;
- the **ingress** (``ingress_lists``): the lists a plain Celery producer (``send_task``) pushes to, named as kombu
  names them (``<queue>``, ``<queue>\\x06\\x163``, ... per priority), with records of their own like a model's
  (``swapless:{queue/*ingress}:held`` ...): a worker moves what arrives there into its model's lists;
- per **queue**: ``swapless:<queue>:placement-bell`` (rung when a model has no holder), ``:routes`` (run-time
  route weights), ``:shadow`` (shadow agreement counts), ``:wake:<worker id>`` (a worker's own bell, rung by its
  acks when they free room a waiting fetch had none of), and the webhooks' (``swapless.tasks.broker.webhooks``):
  ``:webhooks:due`` (delivery ids by next attempt time), ``:webhook:<id>`` (one delivery), ``:webhooks:failed``
  (deliveries that failed after their last retry);
- per **deployment**: ``swapless:worker:<id>`` (a worker's heartbeat) and ``swapless:workers`` (their index),
  ``swapless:learned:<device>`` (what workers learned of each model) and ``swapless:learned-devices`` (those
  kinds), ``swapless:gateway:...`` (the gateway's
  per-caller limits and in-flight sets), ``swapless:batch:<id>`` (a batch's state, a hash) with ``:lease`` (its
  driver's lease), and ``swapless:batches`` / ``swapless:batches:active`` (every batch by creation time, and those
  not final yet).

Results and what lives beside them per job (attempts, the gateway's record, a shadowed job's reference) are the
result backend's keys (``swapless.tasks.broker.results.ResultStore``).

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
    """Lists of jobs, one per priority in the order they are served, and the records of the jobs workers fetched
    from them and have not acked: a model's (``ModelKeys``), or the ingress's."""

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
    """The keys of one model under one queue (see the module docstring)."""

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
        """Rung by a producer whose job's model no worker holds: wakes an idle worker to place it."""
        return self._queue_key("placement-bell")

    def wake(self, worker_id: str) -> str:
        """A worker's own bell: its acks ring it when they free room under a model's hold limit while its fetch
        waits, so that the fetch that had no room for that model runs again at once."""
        return self._queue_key(f"wake:{worker_id}")

    @property
    def routes(self) -> str:
        """The hash of route weights set with ``swapless route`` (route id -> JSON weights)."""
        return self._queue_key("routes")

    @property
    def shadow_counts(self) -> str:
        """The hash of shadow agreement counts (``<route>|<served>|<shadow>|agree`` and ``...|total`` -> count)."""
        return self._queue_key("shadow")

    @property
    def webhooks_due(self) -> str:
        """The sorted set of webhook deliveries waiting to be sent (score: the time of the next attempt)."""
        return self._queue_key("webhooks:due")

    def webhooks_owner(self, owner: str) -> str:
        """The sorted set of one API key's webhook deliveries waiting (score: when each was queued): its bound."""
        return self._queue_key(f"webhooks:owner:{owner}")

    def webhook(self, delivery_id: str) -> str:
        """One webhook delivery (its target, payload and attempts), kept until it is delivered or failed."""
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
        """The set of device kinds some worker learned on (what the autoscaling signals read with no worker live)."""
        return f"{self.prefix}swapless:learned-devices"

    def gateway_inflight(self, owner: str) -> str:
        """The sorted set of one gateway caller's jobs in flight."""
        return f"{self.prefix}swapless:gateway:inflight:{owner}"

    @property
    def gateway_rate(self) -> str:
        """What the gateway's rate limits' keys start with (the ``limits`` library adds the rest)."""
        return f"{self.prefix}swapless:gateway:rate"

    def batch(self, batch_id: str) -> str:
        """The hash of one batch's state (``swapless.tasks.gateway.batches.state``)."""
        return f"{self.prefix}swapless:batch:{batch_id}"

    def batch_lease(self, batch_id: str) -> str:
        """The lease of the process driving one batch (its runner id, with a TTL it renews)."""
        return f"{self.prefix}swapless:batch:{batch_id}:lease"

    @property
    def batches(self) -> str:
        """The sorted set of every batch id (score: its creation time)."""
        return f"{self.prefix}swapless:batches"

    @property
    def active_batches(self) -> str:
        """The set of batch ids not in a final state yet: what runners look for work in."""
        return f"{self.prefix}swapless:batches:active"

    def owner_batches(self, owner: str) -> str:
        """The sorted set of one API key's batch ids (score: creation time): its listing and its quota."""
        return f"{self.prefix}swapless:batches:owner:{owner}"

    def owner_files(self, owner: str) -> str:
        """The hash of one API key's batch files: file id -> ``"<created_at> <bytes>"`` (its listing and quotas)."""
        return f"{self.prefix}swapless:files:owner:{owner}"
