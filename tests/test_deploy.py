"""The Kubernetes manifests in deploy/k8s/ against the code they run, with no cluster and no network.

Every container runs a real ``swapless`` command with real options (typer's click command, parsed as the CLI
would); every ``SWAPLESS_*`` variable is a setting, and the ConfigMap loads as settings; every port a probe or a
Service targets is one the container's command listens on, on an address the kubelet can reach; every
``swapless_*`` metric named anywhere (KEDA's query, the HPA's metric) is exported
(``swapless.tasks.observe.scaling.SIGNALS`` or the worker's metrics); the workers' drain fits their grace period; the
autoscalers' bounds are the settings'. Each failure is one line naming the file and what to fix.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "deploy" / "k8s"

#: The files deploy/k8s/README.md describes.
EXPECTED_FILES = ("redis.yaml", "config.yaml", "worker.yaml", "gateway.yaml", "exporter.yaml", "keda.yaml",
"hpa.yaml")

#: kind -> the apiVersion it is served under.
API_VERSIONS = {
    "ConfigMap": "v1",
    "Secret": "v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "HorizontalPodAutoscaler": "autoscaling/v2",
    "ScaledObject": "keda.sh/v1alpha1",
    "TriggerAuthentication": "keda.sh/v1alpha1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "ServiceAccount": "v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
}
WORKLOADS = ("Deployment", "StatefulSet")

#: A command's listening-port option -> the option naming the address it binds.
PORT_HOSTS = {"--port": "--host", "--metrics-port": "--metrics-host"}
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
METRIC = re.compile(r"\bswapless_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


@dataclass(frozen=True)
class Doc:
    file: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name", ""))

    @property
    def where(self) -> str:
        return f"deploy/k8s/{self.file}: {self.kind} {self.name}"


@cache
def docs() -> tuple[Doc, ...]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for body in yaml.safe_load_all(path.read_text()):
            if body is not None:
                found.append(Doc(path.name, body))
    return tuple(found)


def of_kind(*kinds: str) -> list[Doc]:
    return [doc for doc in docs() if doc.kind in kinds]


def pod_spec(doc: Doc) -> dict[str, Any]:
    return doc.body["spec"]["template"]["spec"]


def containers(doc: Doc) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def argv(container: dict[str, Any]) -> list[str]:
    return [str(part) for part in (*container.get("command", []), *container.get("args", []))]


def runs_redis(container: dict[str, Any]) -> bool:
    return str(container.get("image", "")).split(":")[0].split("/")[-1] == "redis"


@cache
def cli() -> Any:
    """The ``swapless`` click group typer builds (typer may vendor its own click: duck-typed, no isinstance)."""
    from swapless.tasks.cli.main import app

    group = typer.main.get_command(app)
    assert hasattr(group, "commands"), "tasks/cli/main.py: the typer app is not a group of commands; fix the test"
    return group


def parse_options(file: str, words: list[str]) -> dict[str, str | None]:
    """``swapless SUB [options]`` checked against the command's click params; returns each option given -> value.

    Every option must exist on the command, and the whole line must parse as the CLI would parse it (types,
    ranges, a value where one is needed)."""
    assert len(words) >= 2 and words[0] == "swapless", (
        f"deploy/k8s/{file}: {' '.join(words)!r} is not a `swapless <command>` line; run a swapless command"
    )
    sub, rest = words[1], words[2:]
    command = cli().commands.get(sub)
    assert command is not None, (
        f"deploy/k8s/{file}: `swapless {sub}` is no command of the CLI (it has {', '.join(sorted(cli().commands))}); "
        "fix the command or add it to tasks/cli"
    )
    options = {
        opt: param
        for param in command.params
        if param.param_type_name == "option"
        for opt in (*param.opts, *param.secondary_opts)
    }
    given: dict[str, str | None] = {}
    i = 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("-") and word != "-":
            name, eq, value = word.partition("=")
            param = options.get(name)
            assert param is not None, (
                f"deploy/k8s/{file}: `swapless {sub}` has no option {name} (it has {', '.join(sorted(options))}); "
                "fix the manifest or add the option"
            )
            if param.is_flag or param.count:
                given[name] = None
            elif eq:
                given[name] = value
            else:
                i += 1
                given[name] = rest[i] if i < len(rest) else None
        i += 1
    try:
        command.make_context(f"swapless {sub}", list(rest), resilient_parsing=False)
    except Exception as err:  # noqa: BLE001 - click's UsageError / BadParameter, from typer's click
        message = err.format_message() if hasattr(err, "format_message") else repr(err)
        pytest.fail(f"deploy/k8s/{file}: `{' '.join(words)}` does not parse: {message}; fix its options")
    return given


def swapless_lines(doc: Doc) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    """Every ``swapless ...`` a pod runs: (what, its container, the words): the command, hooks, exec probes."""
    for container in containers(doc):
        words = argv(container)
        if words and words[0] == "swapless":
            yield "command", container, words
        for hook, handler in (container.get("lifecycle") or {}).items():
            words = [str(w) for w in ((handler or {}).get("exec") or {}).get("command", [])]
            if words and words[0] == "swapless":
                yield hook, container, words
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            words = [str(w) for w in ((container.get(probe) or {}).get("exec") or {}).get("command", [])]
            if words and words[0] == "swapless":
                yield probe, container, words


@cache
def setting_names() -> frozenset[str]:
    from swapless.config.settings import fields

    return frozenset("SWAPLESS_" + name.upper() for name in fields())


@cache
def metric_names() -> frozenset[str]:
    from swapless.tasks.observe import metrics, scaling

    return frozenset((*scaling.SIGNALS, *metrics.METRICS))


def configmaps() -> dict[str, dict[str, str]]:
    return {doc.name: {k: str(v) for k, v in (doc.body.get("data") or {}).items()} for doc in of_kind("ConfigMap")}


def secrets() -> dict[str, dict[str, str]]:
    found = {}
    for doc in of_kind("Secret"):
        values = {k: base64.b64decode(str(v)).decode() for k, v in (doc.body.get("data") or {}).items()}
        values.update({k: str(v) for k, v in (doc.body.get("stringData") or {}).items()})
        found[doc.name] = values
    return found


def container_env(doc: Doc, container: dict[str, Any]) -> dict[str, str]:
    """The variables a container gets from its envFrom and its plain env values."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps().get(source["configMapRef"]["name"], {}))
        if "secretRef" in source:
            env.update(secrets().get(source["secretRef"]["name"], {}))
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
    return env


def scale_setting(name: str) -> int:
    values = [data[name] for data in configmaps().values() if name in data]
    assert len(values) == 1, f"deploy/k8s/config.yaml: set {name} once in the ConfigMap (found {len(values)})"
    return int(values[0])


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def listening(file: str, container: dict[str, Any]) -> tuple[dict[int, tuple[str, str]], dict[str, int]]:
    """(port -> (the option naming its address, the address)) and (port name -> containerPort) of a container: a
    swapless command's --port / --metrics-port values (the address from --host / --metrics-host, 127.0.0.1 when
    not given), else (Redis and others) its declared containerPorts (bound to every address)."""
    named = {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}
    words = argv(container)
    if words[:1] == ["swapless"]:
        given = parse_options(file, words)
        ports: dict[int, tuple[str, str]] = {}
        for option, host in PORT_HOSTS.items():
            if given.get(option):
                ports[int(str(given[option]))] = (host, str(given.get(host) or "127.0.0.1"))
        return ports, named
    return {int(p["containerPort"]): ("", "0.0.0.0") for p in container.get("ports", [])}, named


def resolve(port: Any, named: dict[str, int]) -> int | None:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    return named.get(str(port))


# -- the files ---------------------------------------------------------------------------------------------------


def test_every_manifest_is_there_and_parses() -> None:
    present = {path.name for path in K8S.glob("*.yaml")}
    missing = [name for name in EXPECTED_FILES if name not in present]
    assert not missing, f"deploy/k8s/: {', '.join(missing)} missing; add them (deploy/k8s/README.md lists each)"
    assert (K8S / "README.md").is_file(), "deploy/k8s/README.md is missing; say there how to apply the manifests"
    for doc in docs():
        assert isinstance(doc.body, dict), f"deploy/k8s/{doc.file}: a document is not a mapping; fix its YAML"


def test_every_object_has_its_required_keys() -> None:
    for doc in docs():
        for key in ("apiVersion", "kind"):
            assert doc.body.get(key), f"deploy/k8s/{doc.file}: a document has no {key}; add it"
        assert doc.name, f"deploy/k8s/{doc.file}: a {doc.kind} has no metadata.name; add one"
        expected = API_VERSIONS.get(doc.kind)
        assert expected is not None, f"{doc.where}: kind not known to this test; add it to API_VERSIONS if intended"
        assert doc.body["apiVersion"] == expected, (
            f"{doc.where}: apiVersion {doc.body['apiVersion']}, expected {expected}; fix the apiVersion"
        )
    names = [(doc.kind, doc.name) for doc in docs()]
    duplicates = sorted({f"{kind} {name}" for kind, name in names if names.count((kind, name)) > 1})
    assert not duplicates, f"deploy/k8s/: {', '.join(duplicates)} defined twice; rename one"


def test_selectors_match_template_labels() -> None:
    workloads = of_kind(*WORKLOADS)
    for doc in workloads:
        selector = (doc.body["spec"].get("selector") or {}).get("matchLabels") or {}
        labels = (doc.body["spec"]["template"].get("metadata") or {}).get("labels") or {}
        assert selector, f"{doc.where}: no spec.selector.matchLabels; add the pod template's labels"
        mismatched = {k: v for k, v in selector.items() if labels.get(k) != v}
        assert not mismatched, f"{doc.where}: selector {mismatched} not in the template's labels {labels}; align them"
    templates = [(doc.body["spec"]["template"].get("metadata") or {}).get("labels") or {} for doc in workloads]
    for doc in of_kind("Service"):
        selector = doc.body["spec"].get("selector") or {}
        assert selector, f"{doc.where}: no spec.selector; select the pods it fronts"
        assert any(all(labels.get(k) == v for k, v in selector.items()) for labels in templates), (
            f"{doc.where}: selector {selector} matches no pod template in deploy/k8s; fix the selector or the labels"
        )
    deployments = {doc.name for doc in of_kind("Deployment")}
    for doc in of_kind("ScaledObject", "HorizontalPodAutoscaler"):
        target = doc.body["spec"]["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment" and target.get("name") in deployments, (
            f"{doc.where}: scaleTargetRef {target} names no Deployment in deploy/k8s; point it at swapless-worker"
        )


# -- commands, settings, ports, metrics --------------------------------------------------------------------------


def test_containers_run_real_swapless_commands() -> None:
    seen = 0
    for doc in of_kind(*WORKLOADS):
        for container in containers(doc):
            if runs_redis(container):
                continue
            words = argv(container)
            assert words[:1] == ["swapless"], (
                f"{doc.where}: container {container['name']} runs {words!r}, not `swapless <command>`; fix its command"
            )
        for _what, _container, words in swapless_lines(doc):
            parse_options(doc.file, words)
            seen += 1
    assert seen, "deploy/k8s/: no container runs `swapless ...`; the manifests should run the worker and the gateway"


def test_every_swapless_variable_is_a_setting() -> None:
    known = setting_names()
    where_names: list[tuple[str, str]] = []
    for doc in of_kind("ConfigMap"):
        where_names += [(doc.where, name) for name in (doc.body.get("data") or {})]
    for doc in of_kind("Secret"):
        where_names += [
            (doc.where, name) for name in (*(doc.body.get("data") or {}), *(doc.body.get("stringData") or {}))
        ]
    for doc in of_kind(*WORKLOADS):
        for container in containers(doc):
            where_names += [
                (f"{doc.where} container {container['name']}", var["name"]) for var in container.get("env", [])
            ]
    for where, name in where_names:
        if name.startswith("SWAPLESS_"):
            assert name in known, f"{where}: {name} is no setting of config/settings/; fix the name or drop it"


def test_env_sources_exist() -> None:
    maps, keys = configmaps(), secrets()
    for doc in of_kind(*WORKLOADS):
        for container in containers(doc):
            for source in container.get("envFrom", []):
                for ref, defined in (("configMapRef", maps), ("secretRef", keys)):
                    if ref in source and not source[ref].get("optional"):
                        assert source[ref]["name"] in defined, (
                            f"{doc.where}: envFrom {ref} {source[ref]['name']} is defined nowhere in deploy/k8s; "
                            "fix the name (config.yaml defines swapless-config and swapless-keys)"
                        )


def test_each_containers_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """What each swapless container gets (its ConfigMap, Secret and env values) loads as Settings: no bad value,
    no misspelt name, no inconsistent pair (min above max, a sentinel URL without its master)."""
    from swapless.config.errors import SwaplessError
    from swapless.config.settings import load_settings

    for doc in of_kind(*WORKLOADS):
        for container in containers(doc):
            if argv(container)[:1] != ["swapless"]:
                continue
            with monkeypatch.context() as env:
                for name in [name for name in os.environ if name.startswith("SWAPLESS_")]:
                    env.delenv(name)
                for name, value in container_env(doc, container).items():
                    env.setenv(name, value)
                try:
                    load_settings()
                except SwaplessError as err:
                    pytest.fail(f"{doc.where}: container {container['name']}'s settings do not load: {err}; fix them")


def test_probes_and_services_target_ports_that_listen() -> None:
    pods: list[tuple[Doc, dict[str, Any], dict[str, Any]]] = []  # (doc, pod labels, container)
    for doc in of_kind(*WORKLOADS):
        labels = (doc.body["spec"]["template"].get("metadata") or {}).get("labels") or {}
        for container in containers(doc):
            pods.append((doc, labels, container))
            ports, named = listening(doc.file, container)
            name = f"{doc.where} container {container['name']}"
            if argv(container)[:1] == ["swapless"]:
                for declared in container.get("ports", []):
                    assert int(declared["containerPort"]) in ports, (
                        f"{name}: containerPort {declared['containerPort']} is not a port its command listens on "
                        f"({sorted(ports)}); pass it as --port/--metrics-port or drop it"
                    )
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                spec = container.get(probe) or {}
                for way in ("httpGet", "tcpSocket", "grpc"):
                    if way not in spec:
                        continue
                    port = resolve(spec[way].get("port"), named)
                    assert port in ports, (
                        f"{name}: {probe} {way} port {spec[way].get('port')} is not one it listens on "
                        f"({sorted(ports)}); probe a port from its --port/--metrics-port"
                    )
                    option, address = ports[port]
                    assert address not in LOOPBACK, (
                        f"{name}: {probe} targets port {port}, bound to {address}, which the kubelet cannot reach; "
                        f"pass {option} 0.0.0.0"
                    )
    for doc in of_kind("Service"):
        selector = doc.body["spec"].get("selector") or {}
        chosen = [listening(d.file, c) for d, labels, c in pods if all(labels.get(k) == v for k, v in selector.items())]
        for port in doc.body["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            reached = [ports[number] for ports, named in chosen if (number := resolve(target, named)) in ports]
            assert reached, (
                f"{doc.where}: targetPort {target} is no port the selected pods listen on; fix targetPort or the pods"
            )
            for option, address in reached:
                assert address not in LOOPBACK, (
                    f"{doc.where}: targetPort {target} is bound to {address} in the pod; pass {option} 0.0.0.0"
                )


def test_metric_names_are_exported() -> None:
    known = metric_names()
    for doc in docs():
        for text in strings(doc.body):
            for name in METRIC.findall(text):
                base = next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
                assert name in known or base in known, (
                    f"{doc.where}: metric {name} is exported by neither tasks.observe.scaling.SIGNALS nor the "
                    "worker (tasks/observe/metrics.py); fix the name"
                )


def test_service_names_do_not_look_like_settings() -> None:
    """The kubelet gives pods of the namespace NAME_SERVICE_HOST, NAME_PORT=tcp://..., ... for each Service (NAME
    upper-cased, - as _; unless a pod sets enableServiceLinks: false): a Service called swapless-exporter makes
    SWAPLESS_EXPORTER_PORT=tcp://..., which is a setting, and every swapless command there stops on it."""
    for doc in of_kind("Service"):
        prefix = doc.name.upper().replace("-", "_")
        assert not prefix.startswith("SWAPLESS"), (
            f"{doc.where}: its link variables ({prefix}_PORT, ...) would read as SWAPLESS_ settings in every pod; "
            "rename the Service (e.g. without the swapless- prefix)"
        )


# -- the workers and their autoscaling ---------------------------------------------------------------------------


def worker_deployments() -> list[tuple[Doc, dict[str, Any]]]:
    found = [
        (doc, container)
        for doc in of_kind(*WORKLOADS)
        for container in containers(doc)
        if argv(container)[:2] == ["swapless", "worker"]
    ]
    assert found, "deploy/k8s/worker.yaml: no container runs `swapless worker`; add the worker Deployment"
    return found


def test_workers_get_a_gpu_and_drain_within_their_grace_period() -> None:
    for doc, container in worker_deployments():
        given = parse_options(doc.file, argv(container))
        if str(given.get("--device", "")).startswith("cuda"):
            gpus = ((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
            assert str(gpus) == "1", (
                f"{doc.where}: a --device cuda worker without resources.limits nvidia.com/gpu: 1; add the limit"
            )
        assert "replicas" not in doc.body["spec"] or doc.body["spec"]["replicas"] <= 1, (
            f"{doc.where}: spec.replicas set; leave it unset (keda.yaml or hpa.yaml owns it)"
        )
        hook = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
        words = [str(w) for w in hook.get("command", [])]
        assert words[:2] == ["swapless", "drain"], (
            f"{doc.where}: no preStop `swapless drain --here --timeout N`; add it so a scale-down drains the worker"
        )
        drain = parse_options(doc.file, words)
        assert "--here" in drain, f"{doc.where}: the preStop drain lacks --here; drain this pod's workers only"
        timeout = float(str(drain.get("--timeout") or 60))  # the command's default
        grace = int(pod_spec(doc).get("terminationGracePeriodSeconds", 30))
        assert timeout < grace, (
            f"{doc.where}: drain --timeout {timeout:g} is not below terminationGracePeriodSeconds {grace}; "
            "raise the grace period (drain timeout plus a margin)"
        )


def test_keda_follows_the_desired_workers() -> None:
    low, high = scale_setting("SWAPLESS_SCALE_MIN_WORKERS"), scale_setting("SWAPLESS_SCALE_MAX_WORKERS")
    scaled = of_kind("ScaledObject")
    assert scaled, "deploy/k8s/keda.yaml: no ScaledObject; add one targeting swapless-worker"
    for doc in scaled:
        spec = doc.body["spec"]
        assert spec.get("maxReplicaCount") == high, (
            f"{doc.where}: maxReplicaCount {spec.get('maxReplicaCount')} but SWAPLESS_SCALE_MAX_WORKERS is {high} "
            "in config.yaml; make them equal"
        )
        assert spec.get("minReplicaCount", 0) == low, (
            f"{doc.where}: minReplicaCount {spec.get('minReplicaCount', 0)} but SWAPLESS_SCALE_MIN_WORKERS is {low} "
            "in config.yaml; make them equal"
        )
        prometheus = [t for t in spec.get("triggers", []) if t.get("type") == "prometheus"]
        desired = [t for t in prometheus if "swapless_workers_desired" in str(t["metadata"].get("query", ""))]
        assert desired, f"{doc.where}: no prometheus trigger on swapless_workers_desired; add one"
        for trigger in desired:
            assert trigger.get("metricType", "AverageValue") == "AverageValue", (
                f"{doc.where}: metricType {trigger.get('metricType')}; use AverageValue (replicas = value / threshold)"
            )
            assert float(trigger["metadata"]["threshold"]) == 1, (
                f'{doc.where}: threshold {trigger["metadata"]["threshold"]}; use "1" so replicas follow the value'
            )


def test_hpa_follows_the_desired_workers() -> None:
    high = scale_setting("SWAPLESS_SCALE_MAX_WORKERS")
    hpas = of_kind("HorizontalPodAutoscaler")
    assert hpas, "deploy/k8s/hpa.yaml: no HorizontalPodAutoscaler; add the KEDA-less alternative"
    for doc in hpas:
        spec = doc.body["spec"]
        assert spec.get("maxReplicas") == high, (
            f"{doc.where}: maxReplicas {spec.get('maxReplicas')} but SWAPLESS_SCALE_MAX_WORKERS is {high} "
            "in config.yaml; make them equal"
        )
        assert spec.get("minReplicas", 1) >= 1, f"{doc.where}: minReplicas below 1 needs HPAScaleToZero; use 1"
        external = [m["external"] for m in spec.get("metrics", []) if m.get("type") == "External"]
        desired = [m for m in external if m["metric"]["name"] == "swapless_workers_desired"]
        assert desired, f"{doc.where}: no External metric swapless_workers_desired; add it"
        for metric in desired:
            target = metric["target"]
            assert target.get("type") == "AverageValue" and float(str(target.get("averageValue"))) == 1, (
                f'{doc.where}: target {target}; use type AverageValue, averageValue "1"'
            )


def test_redis_keeps_every_job() -> None:
    for doc in of_kind(*WORKLOADS):
        for container in containers(doc):
            if not runs_redis(container):
                continue
            line = " ".join(argv(container))
            assert "--appendonly yes" in line and "--maxmemory-policy noeviction" in line, (
                f"{doc.where}: Redis without --appendonly yes --maxmemory-policy noeviction; a queue must not drop jobs"
            )


def test_a_worker_that_keeps_its_pod_deletion_cost_may_patch_its_pod() -> None:
    """SWAPLESS_POD_DELETION_COST needs the pod's name and namespace from the downward API and a service account
    whose Role may patch pods (tasks/observe/podcost.py)."""
    roles = {doc.name: doc.body for doc in of_kind("Role")}
    bound = {doc.body["subjects"][0]["name"]: doc.body["roleRef"]["name"] for doc in of_kind("RoleBinding")}
    accounts = {doc.name for doc in of_kind("ServiceAccount")}
    checked = 0
    for doc in of_kind(*WORKLOADS):
        spec = doc.body["spec"]["template"]["spec"]
        for container in containers(doc):
            env = {e["name"]: e for e in container.get("env", [])}
            if env.get("SWAPLESS_POD_DELETION_COST", {}).get("value") != "true":
                continue
            checked += 1
            for name, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
                assert env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == field, (
                    f"{doc.where}: {name} must come from the downward API ({field})")
            account = spec.get("serviceAccountName")
            assert account in accounts, f"{doc.where}: its serviceAccountName {account} is defined nowhere"
            rules = roles[bound[account]]["rules"]
            assert any("pods" in r["resources"] and "patch" in r["verbs"] and r["apiGroups"] == [""] for r in rules), (
                f"{doc.where}: the Role bound to {account} does not allow patch on pods")
    assert checked, "no worker keeps its pod deletion cost (deploy/k8s/worker.yaml sets SWAPLESS_POD_DELETION_COST)"
