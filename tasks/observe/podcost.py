"""Keeps this worker's pod's ``controller.kubernetes.io/pod-deletion-cost`` annotation at its ``RemovalCost.rank``,
so that a Deployment scaling down deletes first the pod whose loss costs the fleet least.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import httpx
import redis

from swapless.config.settings import ScalingSettings
from swapless.tasks.cluster.members import read_heartbeats
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.scaling import RemovalCost, removal_costs

__all__ = ["ANNOTATION", "PodDeletionCost", "deletion_cost"]

logger = logging.getLogger(__name__)

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: The annotation is an int32.
_MAX_COST = 2**31 - 1


def deletion_cost(cost: RemovalCost) -> int:
    """``cost.rank`` as one integer, each part in tenths of a second."""
    interactive = round(cost.interactive_load_s * 10)
    loads = min(round(cost.load_s * 10), 999)
    return min(interactive * 2000 + (1000 if cost.held else 0) + loads, _MAX_COST)


class PodDeletionCost:
    """Writes this worker's deletion cost on its pod; an ``after_beat`` hook.

    Args:
        api_url: the API server (``https://host:port``).
        token: the service account token.
        ca: the CA bundle that checks the API server's certificate.
        interval_s: the least time between two writes.
    """

    def __init__(
        self, client: redis.Redis, keyspace: Keyspace, worker_id: str, *, api_url: str, namespace: str, pod: str,
        token: str, ca: Path, interval_s: float,
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.worker_id = worker_id
        self.path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
        self.interval_s = interval_s
        self.written: int | None = None
        self._written_at = -float("inf")
        self._http = httpx.Client(base_url=api_url, verify=str(ca), timeout=5.0,
                                  headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def from_environment(
        cls, settings: ScalingSettings, client: redis.Redis, keyspace: Keyspace, worker_id: str
    ) -> PodDeletionCost | None:
        """The writer of this pod, when ``SWAPLESS_POD_DELETION_COST`` is on and the worker runs in a pod it can
        annotate; else None (logging what is missing)."""
        if not settings.pod_deletion_cost:
            return None
        env = os.environ
        account = settings.kubernetes_service_account_dir
        missing = [name for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAME", "POD_NAMESPACE")
                   if not env.get(name)]
        missing += [str(account / name) for name in ("token", "ca.crt") if not (account / name).is_file()]
        if missing:
            logger.warning("SWAPLESS_POD_DELETION_COST is on but %s is missing: not keeping the pod's deletion cost "
                           "(set POD_NAME and POD_NAMESPACE from the downward API; see deploy/k8s/worker.yaml)",
                           ", ".join(missing))
            return None
        host = env["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host  # an IPv6 service address
        return cls(client, keyspace, worker_id, api_url=f"https://{host}:{env['KUBERNETES_SERVICE_PORT']}",
                   namespace=env["POD_NAMESPACE"], pod=env["POD_NAME"],
                   token=(account / "token").read_text().strip(), ca=account / "ca.crt",
                   interval_s=settings.pod_deletion_cost_interval_s)

    def __call__(self) -> None:
        """Write the cost if it changed and the last write is ``interval_s`` old (run after each heartbeat)."""
        if time.monotonic() - self._written_at < self.interval_s:
            return
        beats = [beat for beat in read_heartbeats(self.client, self.keyspace) if beat.queue == self.keyspace.queue]
        mine = removal_costs(beats).get(self.worker_id)
        if mine is None:
            return  # its own heartbeat is not written yet
        value = deletion_cost(mine)
        if value == self.written:
            return
        self._written_at = time.monotonic()
        patch = {"metadata": {"annotations": {ANNOTATION: str(value)}}}
        try:
            response = self._http.patch(self.path, json=patch,
                                        headers={"Content-Type": "application/merge-patch+json"})
            response.raise_for_status()
        except httpx.HTTPError as err:
            logger.warning("could not write the pod's deletion cost (%s); trying again in %.0f s", err,
                           self.interval_s)
            return
        self.written = value
        logger.info("pod deletion cost now %d (%s)", value, mine.text())

    def close(self) -> None:
        self._http.close()
