"""Settings of monitoring and autoscaling."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ObserveSettings", "ScalingSettings"]


class ObserveSettings(BaseModel):
    """Events, heartbeats and metrics endpoints."""

    model_config = ConfigDict(title="Monitoring")

    task_events: bool = Field(
        False,
        description="Celery task events per job (Flower); they cost 10-25 % of single-model throughput",
    )
    heartbeat_interval_s: float = Field(
        2.0, gt=0,
        description="How often a worker publishes its status; the key expires after 3 intervals",
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535,
        description="Port of the worker's Prometheus endpoint (`/metrics`); unset: no metrics server, no port opened",
    )
    metrics_host: str = Field("127.0.0.1", description="Address the Prometheus endpoint binds to")
    exporter_port: int = Field(
        9808, ge=1, le=65535,
        description="Port of `swapless exporter`'s `/metrics` (the autoscaling signals, for deployments without the "
        "gateway)",
    )


class ScalingSettings(BaseModel):
    """The autoscaling signals and the pod-deletion cost."""

    model_config = ConfigDict(title="Autoscaling")

    scale_drain_s: float = Field(
        300.0, gt=0,
        description="Autoscaling: the time a backlog should take to drain; `swapless_workers_desired` asks for "
        "backlog seconds / this many workers on top of the demand",
    )
    scale_target_utilization: float = Field(
        0.8, gt=0, le=1,
        description="Autoscaling: the share of each worker's device time the work arriving may fill",
    )
    scale_window_s: float = Field(60.0, gt=0, description="Autoscaling: the window the work arriving is measured over")
    scale_min_workers: int = Field(
        0, ge=0,
        description="Autoscaling: `swapless_workers_desired` never asks for fewer (0: scale to zero when idle)",
    )
    scale_max_workers: int = Field(16, ge=1, description="Autoscaling: `swapless_workers_desired` never asks for more")
    scale_unknown_job_s: float = Field(
        0.05, ge=0,
        description="Autoscaling: device seconds per job of a model no worker has measured on the fleet's kind of "
        "device",
    )
    scale_unknown_load_s: float = Field(10.0, ge=0, description="Autoscaling: load seconds of a model never measured")
    scale_busy_s: float = Field(
        1.0, gt=0,
        description="Autoscaling: a worker with this many device seconds of work of its own (jobs it holds, its share"
        " of those waiting for the models it claims) is busy; `swapless_workers_desired` never asks for fewer workers"
        " than are busy",
    )
    # In Kubernetes, keep the pod's controller.kubernetes.io/pod-deletion-cost current (tasks.observe.podcost).
    pod_deletion_cost: bool = Field(
        False,
        description="In Kubernetes, keep the pod's `controller.kubernetes.io/pod-deletion-cost` annotation at the "
        "worker's removal cost (needs POD_NAME, POD_NAMESPACE and `patch` on pods)",
    )
    pod_deletion_cost_interval_s: float = Field(
        10.0, gt=0,
        description="The pod-deletion cost is written at most this often (each write is a pod update)",
    )
    kubernetes_service_account_dir: Path = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount"),
        description="Where the pod's service account token and CA are mounted",
    )

    @model_validator(mode="after")
    def _check_scale(self) -> ScalingSettings:
        if self.scale_min_workers > self.scale_max_workers:
            raise ValueError(
                f"SWAPLESS_SCALE_MIN_WORKERS ({self.scale_min_workers}) is above SWAPLESS_SCALE_MAX_WORKERS "
                f"({self.scale_max_workers}): lower the first or raise the second"
            )
        return self
