"""deploy/k8s/: the manifests are valid Kubernetes objects (checked offline against the
API's own JSON schemas, strictly: an unknown or misspelt field fails), and they agree with
the Corral config they carry: the port, the probes' model, the mounts the config's paths
need, and a grace period long enough for Corral's drain."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

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


def documents() -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]


def one(kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents() if d["kind"] == kind]
    return found


def container() -> dict[str, Any]:
    (c,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_there_are_manifests() -> None:
    assert {d["kind"] for d in documents()} >= {"ConfigMap", "Deployment", "Service"}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_for_kubernetes(version: str) -> None:
    for doc in documents():
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
