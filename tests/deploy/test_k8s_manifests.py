"""deploy/k8s/: the manifests are valid Kubernetes objects (checked offline against the
API's own JSON schemas, strictly: an unknown or misspelt field fails; an InferencePool
against its CRD's schema), and they agree with the Corral config they carry: the port, the
probes' model, the mounts the config's paths need, a grace period long enough for Corral's
drain, and the metrics the endpoint picker reads."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError

from supervisor.config.reading import parse

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
# The oldest Kubernetes the manifests are for: preStop's `sleep` action is on by default
# from 1.30 (PodLifecycleSleepAction).
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())


CORRAL = ROOT / "deploy" / "k8s" / "corral.yaml"
POOL = ROOT / "deploy" / "k8s" / "inference-pool.yaml"
# Kinds that Kubernetes' own schemas do not hold, each checked against its CRD instead.
CRDS = {("inference.networking.k8s.io/v1", "InferencePool"): ROOT / "tests" / "fixtures" / "k8s" / "inferencepool-crd-v1.5.0.yaml"}


def documents(paths: list[Path] | None = None) -> list[dict[str, Any]]:
    return [d for path in (paths or MANIFESTS) for d in yaml.safe_load_all(path.read_text()) if d]


def one(kind: str, path: Path = CORRAL) -> dict[str, Any]:
    (found,) = [d for d in documents([path]) if d["kind"] == kind]
    return found


def built_in(doc: dict[str, Any]) -> bool:
    return (doc["apiVersion"], doc["kind"]) not in CRDS


def container() -> dict[str, Any]:
    (c,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_there_are_manifests() -> None:
    assert {d["kind"] for d in documents()} >= {"ConfigMap", "Deployment", "Service", "InferencePool"}
    assert {CORRAL, POOL} <= set(MANIFESTS)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_for_kubernetes(version: str) -> None:
    for doc in filter(built_in, documents()):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_check_catches_a_misspelt_field() -> None:
    doc = copy.deepcopy(one("Deployment"))
    pod = doc["spec"]["template"]["spec"]
    pod["containers"][0]["readinesProbe"] = pod["containers"][0].pop("readinessProbe")
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


def corral_config(tmp_path: Path) -> tuple[dict[str, Any], Any]:
    """The ConfigMap's config.toml, as TOML and as Corral reads it, with the pod's mounts
    laid out under tmp_path (the model files empty: the reader checks they exist)."""
    text = one("ConfigMap")["data"]["config.toml"]
    raw = tomllib.loads(text)
    mounts = {m["mountPath"] for m in container()["volumeMounts"]}
    for model in raw["models"].values():
        path = Path(model["path"])
        assert any(path.is_relative_to(m) for m in mounts), f"{path} is on no mounted volume"
        local = tmp_path / path.relative_to("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(b"")
    localized = text.replace('"/models/', f'"{tmp_path}/models/')
    # The keys come from the Secret through CORRAL_API_KEYS.
    env = {e["name"] for e in container()["env"]}
    assert "CORRAL_API_KEYS" in env
    cfg = parse(localized, tmp_path, "config.toml", api_keys_env="sk-k8s-test-key-0123456789")
    return raw, cfg


def test_the_config_is_one_corral_accepts(tmp_path: Path) -> None:
    raw, cfg = corral_config(tmp_path)
    assert cfg.server.port == raw["server"]["port"]
    assert set(cfg.models) == set(raw["models"])
    # It listens on the pod's address, which Corral allows only with a key.
    assert cfg.server.host == "0.0.0.0" and not cfg.server.allow_insecure_bind


def test_the_pod_agrees_with_the_config(tmp_path: Path) -> None:
    raw, cfg = corral_config(tmp_path)
    c = container()
    (port,) = c["ports"]
    assert port["containerPort"] == cfg.server.port
    config_mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert c["args"][c["args"].index("--config") + 1] == f"{config_mount['mountPath']}/config.toml"
    # Readiness asks about a model the config serves; liveness only that the router answers.
    path = c["readinessProbe"]["httpGet"]["path"]
    assert path.startswith("/health?model=") and path.split("=", 1)[1] in cfg.models
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["port"] == c["livenessProbe"]["httpGet"]["port"] == port["name"]
    # The grace period covers preStop's sleep, the drain, and stopping the workers
    # (corral/serve.py: up to 3 x stop_grace + 5 after the drain).
    pod = one("Deployment")["spec"]["template"]["spec"]
    needed = (
        c["lifecycle"]["preStop"]["sleep"]["seconds"]
        + cfg.server.drain_timeout
        + 3 * cfg.supervisor.stop_grace + 5
    )
    assert pod["terminationGracePeriodSeconds"] >= needed


def test_the_service_reaches_the_pods() -> None:
    service, deployment = one("Service"), one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container()["ports"]}


# ---- the Gateway API Inference Extension: an InferencePool of Corral pods (issue 25) -----------


def _crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load(CRDS[api_version, kind].read_text())
    version = api_version.rsplit("/", 1)[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return dict(served["schema"]["openAPIV3Schema"])


def _strict(schema: Any) -> Any:
    """The CRD's schema with every object closed, as the API server prunes and (with
    kubectl's field validation) refuses unknown fields: a misspelt field fails."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _validate_custom(doc: dict[str, Any]) -> None:
    schema = _strict(_crd_schema(doc["apiVersion"], doc["kind"]))
    # metadata is the API server's (ObjectMeta), not the CRD's to describe.
    schema["properties"]["metadata"] = {"type": "object"}
    jsonschema.validate(doc, schema)


def test_the_inference_pool_is_valid_for_its_crd() -> None:
    pool = one("InferencePool", POOL)
    _validate_custom(pool)
    wrong = copy.deepcopy(pool)
    wrong["spec"]["targetPort"] = wrong["spec"].pop("targetPorts")
    with pytest.raises(jsonschema.ValidationError):
        _validate_custom(wrong)
    bad_mode = copy.deepcopy(pool)
    bad_mode["spec"]["endpointPickerRef"]["failureMode"] = "Open"
    with pytest.raises(jsonschema.ValidationError):
        _validate_custom(bad_mode)


def test_the_pool_selects_corral_pods_on_corral_s_port_and_its_picker_is_served(tmp_path: Path) -> None:
    pool = one("InferencePool", POOL)["spec"]
    _, cfg = corral_config(tmp_path)
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert [p["number"] for p in pool["targetPorts"]] == [cfg.server.port]
    # The picker sends no key: /metrics must answer without one.
    assert cfg.server.public_metrics
    picker = pool["endpointPickerRef"]
    service = one("Service", POOL)
    assert service["metadata"]["name"] == picker["name"]
    assert [p["port"] for p in service["spec"]["ports"]] == [picker["port"]["number"]]
    epp = one("Deployment", POOL)
    assert service["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    (c,) = epp["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--pool-name") + 1] == one("InferencePool", POOL)["metadata"]["name"]
    assert args[args.index("--grpc-port") + 1] == str(picker["port"]["number"])
    mount = next(m for m in c["volumeMounts"] if m["name"] == "plugins-config")
    assert args[args.index("--config-file") + 1].startswith(mount["mountPath"] + "/")
    # v1.4 and later refuse the old --*-metric flags (engineConfigs replaced them).
    assert not any(a.endswith("-metric") for a in args)


def _spec(text: str) -> tuple[str, dict[str, str]]:
    """The picker's metric specification, `name{label="value",...}`, as name and labels."""
    m = re.fullmatch(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?", text.strip())
    assert m is not None, text
    labels = dict(re.findall(r'(\w+)\s*=\s*"?([^",}]+)"?', m.group(2) or ""))
    return m.group(1), labels


def test_the_picker_reads_gauges_that_corral_exports_for_the_pool_s_model(tmp_path: Path) -> None:
    """Each metric the picker's engine config names is a gauge of Corral's /metrics (the
    model server protocol wants gauges; a family without its TYPE reads as 0), labelled
    with a model the pods serve; the pods carry the label that selects that engine config."""
    from router.server.metrics import MODEL_SERVER_GAUGES

    picker = yaml.safe_load(one("ConfigMap", POOL)["data"]["default-plugins.yaml"])
    assert picker["kind"] == "EndpointPickerConfig"
    plugins = {p["type"]: p for p in picker["plugins"]}
    extractor = plugins["core-metrics-extractor"]["parameters"]
    (engine,) = extractor["engineConfigs"]
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels[extractor["engineLabelKey"]] == engine["name"] == extractor["defaultEngine"]
    assert plugins["metrics-data-source"]["parameters"]["path"] == "/metrics"
    _, cfg = corral_config(tmp_path)
    named = {}
    for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
        name, where = _spec(engine[key])
        assert where.keys() == {"model"} and where["model"] in cfg.models, engine[key]
        named[key] = name
    assert named == {
        "queuedRequestsSpec": MODEL_SERVER_GAUGES["TotalQueuedRequests"],
        "runningRequestsSpec": MODEL_SERVER_GAUGES["TotalRunningRequests"],
        "kvUsageSpec": MODEL_SERVER_GAUGES["KVCacheUtilization"],
    }
    # Corral exports no LoRA or cache-config series: those are turned off, not left to
    # vLLM's names.
    assert engine["loraSpec"] == "" and engine["cacheInfoSpec"] == ""
    for profile in picker["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= set(plugins)
