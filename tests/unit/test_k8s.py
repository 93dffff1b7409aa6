"""Offline checks of the Kubernetes deployment (``k8s/``, ``Dockerfile``): no cluster, no Ray.

* every overlay renders with ``kubectl kustomize`` (or ``kustomize build``);
* core objects pass kubernetes-validate's strict schemas (unknown fields are errors);
* RayService objects (and their RayCluster spec) pass the KubeRay CRD schemas from
  ``../shared/schemas/kuberay/``, made strict the way the API server's pruning would silently
  drop unknown fields: here they are errors;
* the generated ``serveConfigV2`` is in sync with ``configs/serve.yaml``, passes Ray Serve's
  own schema, and its import path builds the app (without starting Ray);
* the Ray version of the manifests and of the Dockerfile is the installed one.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import ray
import yaml

from cluster import fastpath

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CRD_DIR = ROOT.parent / "shared" / "schemas" / "kuberay"
CRD_FILES = {"RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
# Kubernetes versions for the core schemas: a widely deployed one and the newest shipped.
K8S_VERSIONS = sorted({"1.32", kubernetes_validate.latest_version().rsplit(".", 1)[0]})
STORE_URL = "postgresql://vaultvec:s3cret@vaultvec-postgres:5432/vaultvec"
SERVE_PORT = 8000

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=Loader)


@functools.cache
def sync_module() -> ModuleType:
    """k8s/sync_serve_config.py, imported from its path (k8s/ is not a package)."""
    spec = importlib.util.spec_from_file_location("sync_serve_config", K8S / "sync_serve_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def kustomize_command(path: Path) -> list[str]:
    if kubectl := shutil.which("kubectl"):
        return [kubectl, "kustomize", str(path)]
    if kustomize := shutil.which("kustomize"):
        return [kustomize, "build", str(path)]
    pytest.skip("neither kubectl nor kustomize is installed: cannot render k8s/overlays")


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    cmd = kustomize_command(K8S / "overlays" / overlay)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return tuple(d for d in yaml.load_all(proc.stdout, Loader=Loader) if d)


def render(overlay: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_render(overlay)))


def rayservice(overlay: str) -> dict[str, Any]:
    found = [o for o in render(overlay) if o["kind"] == "RayService"]
    assert len(found) == 1, f"{overlay}: expected one RayService, found {len(found)}"
    return found[0]


def is_ray_kind(obj: dict[str, Any]) -> bool:
    return obj["apiVersion"].split("/")[0] == "ray.io"


def pod_templates(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = service["spec"]["rayClusterConfig"]
    out = {"head": cluster["headGroupSpec"]["template"]}
    for group in cluster.get("workerGroupSpecs", []):
        out[group["groupName"]] = group["template"]
    return out


def serve_config(overlay: str) -> dict[str, Any]:
    return load_yaml(rayservice(overlay)["spec"]["serveConfigV2"])


def vaultvec_app(config: dict[str, Any]) -> dict[str, Any]:
    (app,) = [a for a in config["applications"] if a["name"] == "vaultvec"]
    return app


# -- rendering and core kinds -------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders(overlay: str) -> None:
    objects = render(overlay)
    kinds = {o["kind"] for o in objects}
    assert "RayService" in kinds
    for obj in objects:
        assert obj["metadata"].get("namespace") == "vaultvec", obj["metadata"]["name"]


def test_overlays_found() -> None:
    assert {"dev", "prod"} <= set(OVERLAYS)


def strict_validate_core(obj: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_pass_strict_schemas(overlay: str) -> None:
    failures = []
    for obj in render(overlay):
        if is_ray_kind(obj):
            continue
        try:
            strict_validate_core(obj)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(map(str, e.path))
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            failures.append(f"{name} (k8s {e.version}) {path}: {e.message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_pod_templates_pass_strict_pod_schema(overlay: str) -> None:
    """The RayService's pod templates are core PodSpecs: hold them to the core schema too."""
    failures = []
    for name, template in pod_templates(rayservice(overlay)).items():
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"vaultvec-{name}", **template.get("metadata", {})},
            "spec": template["spec"],
        }
        try:
            strict_validate_core(pod)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(map(str, e.path))
            failures.append(f"{name} pod template (k8s {e.version}) {path}: {e.message}")
    assert not failures, "\n".join(failures)


def test_strict_core_validation_rejects_a_misspelt_field() -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"prots": [{"port": 80}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        strict_validate_core(service)


# -- KubeRay CRDs ---------------------------------------------------------------------------------


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An openAPIV3Schema made strict for jsonschema.

    The API server prunes fields a structural schema does not declare, so a misspelt field is
    silently dropped; here every object with declared ``properties`` rejects other fields
    (unless marked ``x-kubernetes-preserve-unknown-fields``). ``nullable`` becomes a null type;
    ``x-kubernetes-int-or-string`` already comes with an integer-or-string ``anyOf``; CEL rules
    (``x-kubernetes-validations``) compare against the old object and are not evaluated.
    """
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: strict_schema(v) for k, v in out["properties"].items()}
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict_schema(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = strict_schema(out["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [strict_schema(s) for s in out[key]]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("x-kubernetes-validations", None)
    return out


@functools.cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    path = CRD_DIR / CRD_FILES[kind]
    if not path.exists():
        pytest.skip(f"KubeRay CRD schemas not found at {CRD_DIR} (the shared schemas directory)")
    crd = load_yaml(path.read_text(encoding="utf-8"))
    assert crd["spec"]["names"]["kind"] == kind
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft4Validator(strict_schema(v1["schema"]["openAPIV3Schema"]))


def crd_errors(obj: dict[str, Any]) -> list[str]:
    assert obj["apiVersion"] == "ray.io/v1", obj["apiVersion"]
    errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.path))
    return [f"{obj['kind']} {'/'.join(map(str, e.path))}: {e.message}" for e in errors]


def as_raycluster(service: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": service["metadata"]["name"]},
        "spec": service["spec"]["rayClusterConfig"],
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_objects_pass_kuberay_crds(overlay: str) -> None:
    errors = []
    for obj in render(overlay):
        if not is_ray_kind(obj):
            continue
        errors += crd_errors(obj)
        if obj["kind"] == "RayService":  # its cluster is a RayCluster spec: check it as one
            errors += crd_errors(as_raycluster(obj))
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    "path",
    [
        "spec/serveConfigV2s",
        "spec/rayClusterConfig/headGroupSpec/rayStartParam",
        "spec/rayClusterConfig/workerGroupSpecs/0/template/spec/containers/0/readinesProbe",
    ],
)
def test_crd_validation_rejects_a_misspelt_field(path: str) -> None:
    service = rayservice(OVERLAYS[0])
    *parents, leaf = path.split("/")
    node: Any = service
    for step in parents:
        node = node[int(step)] if step.isdigit() else node[step]
    node[leaf] = "x"
    assert crd_errors(service)


# -- serveConfigV2 --------------------------------------------------------------------------------


def test_generated_serve_config_is_in_sync(capsys: pytest.CaptureFixture[str]) -> None:
    status = sync_module().main(["--check"])
    out, err = capsys.readouterr()
    assert status == 0, f"k8s serve config out of sync with configs/serve.yaml:\n{out}{err}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_serve_config_is_the_generated_one(overlay: str) -> None:
    """Each overlay ships the generated serveConfigV2 meant for it (its own, or the base's)."""
    sync = sync_module()
    outputs = sync.expected_outputs()
    own = K8S / "overlays" / overlay / sync.OUTPUT_NAME
    expected = outputs.get(own, outputs[K8S / "base" / sync.OUTPUT_NAME])
    patch = load_yaml(expected)
    assert rayservice(overlay)["spec"]["serveConfigV2"] == patch["spec"]["serveConfigV2"]


def test_generator_applies_the_k8s_patch() -> None:
    sync = sync_module()
    source = {
        "http_options": {"host": "127.0.0.1", "port": 9000},
        "applications": [
            {
                "name": "vaultvec",
                "import_path": "serve_app.app:build_app",
                "args": {"storage": "file://./vaultvec-data", "shards": 2},
            },
        ],
    }
    out = sync.k8s_serve_config(source, {"args": {"shards": 4, "gateway_replicas": 2}})
    assert out["http_options"] == {"host": "0.0.0.0", "port": SERVE_PORT}
    assert vaultvec_app(out)["args"] == {"shards": 4, "gateway_replicas": 2}
    assert vaultvec_app(source)["args"]["storage"]  # the source is left alone
    with pytest.raises(sync.ConfigError, match="storage"):
        sync.k8s_serve_config(source, {"args": {"storage": "postgresql://x"}})
    with pytest.raises(sync.ConfigError, match="api_key"):
        sync.k8s_serve_config(source, {"args": {"api_key": "k"}})


def model_fields(model: Any) -> set[str]:
    fields = model.model_fields
    return set(fields) | {f.alias for f in fields.values() if f.alias}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_serve_config_passes_ray_serve_schema(overlay: str) -> None:
    from ray.serve.schema import HTTPOptionsSchema, ServeApplicationSchema, ServeDeploySchema

    from serve_app.settings import Settings

    config = serve_config(overlay)
    ServeDeploySchema.model_validate(config)
    # Ray's schema accepts unknown keys (forward compatibility) and Settings ignores unknown
    # args: a misspelt key would be dropped silently, so check the names here.
    assert set(config) <= model_fields(ServeDeploySchema)
    assert set(config["http_options"]) <= model_fields(HTTPOptionsSchema)
    app = vaultvec_app(config)
    assert set(app) <= model_fields(ServeApplicationSchema)
    assert set(app["args"]) <= set(Settings.model_fields), "unknown Settings in args"
    # The store URL and the API keys come from the Secret through VAULTVEC_* variables.
    assert "storage" not in app["args"] and "api_key" not in app["args"]
    assert config["http_options"]["host"] == "0.0.0.0"
    assert config["http_options"]["port"] == SERVE_PORT


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_import_path_builds_the_app(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the Serve controller does with serveConfigV2: import the builder, call it with args.

    Building binds deployments only; it needs no running Ray. The Ray containers' environment
    (from the Secret) must supply the store URL.
    """
    from ray import serve

    monkeypatch.setenv("VAULTVEC_STORAGE", STORE_URL)
    monkeypatch.setenv("VAULTVEC_API_KEY", "test-key")
    app_config = vaultvec_app(serve_config(overlay))
    module_name, _, attr = app_config["import_path"].partition(":")
    builder = getattr(importlib.import_module(module_name), attr)
    was_running = ray.is_initialized()
    app = builder(app_config.get("args") or {})
    assert isinstance(app, serve.Application)
    assert ray.is_initialized() == was_running, "building the app must not start Ray"
    # The ingress deployment's init args are the resolved settings (Ray internals: Ray 2.60).
    ingress = getattr(app, "_bound_deployment", None)
    if ingress is not None:
        settings = ingress.init_args[0]
        assert settings["storage"] == STORE_URL
        assert settings["api_key"] == ["test-key"]
        assert ingress.num_replicas == app_config["args"].get("gateway_replicas", 1)


# -- cluster shape, secrets, probes ---------------------------------------------------------------


def named_port(container: dict[str, Any], port: Any) -> int:
    if isinstance(port, int):
        return port
    (found,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return int(found)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_and_limits(overlay: str) -> None:
    for obj in render(overlay):
        spec = obj.get("spec", {})
        templates: dict[str, Any] = {}
        if obj["kind"] == "RayService":
            templates = pod_templates(obj)
            autoscaler = spec["rayClusterConfig"].get("autoscalerOptions")
            if spec["rayClusterConfig"].get("enableInTreeAutoscaling"):
                assert autoscaler and autoscaler["resources"]["limits"], "autoscaler resources"
        elif "template" in spec:
            templates = {obj["metadata"]["name"]: spec["template"]}
        for name, template in templates.items():
            for c in template["spec"]["containers"]:
                res = c.get("resources", {})
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(res.get(kind, {})), f"{name}/{c['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_containers_get_settings_from_the_secret(overlay: str) -> None:
    objects = render(overlay)
    for name, template in pod_templates(rayservice(overlay)).items():
        (ray_container,) = template["spec"]["containers"][:1]
        env = {e["name"]: e for e in ray_container.get("env", [])}
        for var, key in (("VAULTVEC_STORAGE", "storage-url"), ("VAULTVEC_API_KEY", "api-key")):
            assert var in env, f"{name}: {var} missing"
            ref = env[var]["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("vaultvec-secrets", key), f"{name}: {var}"
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    if "vaultvec-secrets" in secrets:  # generated by the overlay (dev); else created out of band
        assert {"storage-url", "api-key"} <= set(secrets["vaultvec-secrets"]["data"])
    for obj in objects:  # the in-cluster PostgreSQL, when included, gets its password Secret
        if obj["kind"] == "StatefulSet":
            assert "vaultvec-postgres" in secrets, f"{overlay}: no vaultvec-postgres Secret"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_containers_run_with_the_settings_vaultvec_serve_uses(overlay: str) -> None:
    """Ray and Serve read these from every node's environment when they start; a KubeRay
    cluster gets them from its pods, `vaultvec serve` from cluster.fastpath."""
    for name, template in pod_templates(rayservice(overlay)).items():
        (ray_container,) = template["spec"]["containers"][:1]
        env = {e["name"]: e.get("value") for e in ray_container.get("env", [])}
        for var, value in fastpath.ENV.items():
            assert env.get(var) == value, f"{overlay} {name}: {var}={env.get(var)!r}, not {value!r}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_are_ready_when_the_app_answers(overlay: str) -> None:
    templates = pod_templates(rayservice(overlay))
    head = templates.pop("head")["spec"]["containers"][0]
    # KubeRay deploys the app only after the head is ready: /v1/health must not gate the head.
    assert "readinessProbe" not in head
    assert templates, "no worker group"
    for name, template in templates.items():
        container = template["spec"]["containers"][0]
        probe = container["readinessProbe"]["httpGet"]
        assert probe["path"] == "/v1/health", name
        assert named_port(container, probe["port"]) == SERVE_PORT, name


def test_dev_is_one_head_and_one_small_worker_with_postgres() -> None:
    objects = render("dev")
    cluster = rayservice("dev")["spec"]["rayClusterConfig"]
    assert not cluster.get("enableInTreeAutoscaling")
    (group,) = cluster["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
    assert {("StatefulSet", "vaultvec-postgres"), ("Service", "vaultvec-postgres")} <= {
        (o["kind"], o["metadata"]["name"]) for o in objects
    }


def test_prod_autoscales_its_worker_group() -> None:
    cluster = rayservice("prod")["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    (group,) = cluster["workerGroupSpecs"]
    assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert group["minReplicas"] < group["maxReplicas"]
    assert not [o for o in render("prod") if o["kind"] == "Secret"], "prod commits no Secrets"


# -- versions and the image -----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_version_is_the_installed_one(overlay: str) -> None:
    assert rayservice(overlay)["spec"]["rayClusterConfig"]["rayVersion"] == ray.__version__


def test_base_ray_version_is_the_installed_one() -> None:
    base = load_yaml((K8S / "base" / "rayservice.yaml").read_text(encoding="utf-8"))
    assert base["spec"]["rayClusterConfig"]["rayVersion"] == ray.__version__


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            out.append((instruction.upper(), args.strip()))
    return out


def test_dockerfile_uses_the_ray_image_of_the_pinned_version() -> None:
    instructions = dockerfile_instructions()
    froms = [args for ins, args in instructions if ins == "FROM"]
    assert len(froms) == 1, froms
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)-cpu", froms[0])
    assert match, f"not an official CPU Ray image tag: {froms[0]}"
    assert match.group(1) == ray.__version__
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"ray[serve]=={ray.__version__}"' in pyproject, "pyproject.toml must pin this Ray"
    min_minor = re.search(r'requires-python\s*=\s*">=3\.(\d+)"', pyproject)
    assert min_minor and int(match.group(2)) >= int(min_minor.group(1))


def test_dockerfile_installs_the_project_with_the_postgres_extra() -> None:
    runs = [args for ins, args in dockerfile_instructions() if ins == "RUN"]
    installs = [seg for run in runs for seg in re.split(r";|&&|\bthen\b|\belse\b", run)]
    installs = [seg.strip() for seg in installs if "pip install" in seg]
    assert installs, "no pip install"
    for cmd in installs:
        assert "--no-cache-dir" in cmd, cmd
        assert f'"ray[serve]=={ray.__version__}"' in cmd, f"ray not pinned to the image: {cmd}"
        assert re.search(r'"\.\[postgres[,\]]', cmd), f"project not installed with postgres: {cmd}"
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    torch_pin = re.search(r'"(torch==[^"]+)"', pyproject)
    assert torch_pin
    for cmd in installs:
        if "embeddings" in cmd:  # torch pinned in the same pip command as the extra
            assert f'"{torch_pin.group(1)}"' in cmd, cmd
    assert any("embeddings" in cmd for cmd in installs), "no embeddings build option"


def test_dockerfile_copies_no_tests_benchmarks_or_data() -> None:
    sources = []
    for ins, args in dockerfile_instructions():
        if ins in ("COPY", "ADD"):
            parts = [p for p in args.split() if not p.startswith("--")]
            sources += [p.rstrip("/").removeprefix("./") for p in parts[:-1]]
    assert sources
    assert not {"tests", "benchmarks", "data", ".", ".venv", ".git", "k8s"} & set(sources)
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert "*" in ignore, ".dockerignore should exclude everything not listed"
    assert not [p for p in ignore if re.match(r"!(tests|benchmarks|data)\b", p)]


# -- metrics scraping -----------------------------------------------------------------------------

METRICS_PORT = 8080
MONITORING = K8S / "components" / "monitoring"
# The fields of the Prometheus Operator's PodMonitor (monitoring.coreos.com/v1) that a spec here
# may use, level by level: a misspelt field is an error here (the API server would prune it).
PODMONITOR_FIELDS: dict[str, set[str]] = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "spec": {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel", "podTargetLabels"},
    "endpoint": {
        "port",
        "path",
        "interval",
        "scrapeTimeout",
        "scheme",
        "relabelings",
        "metricRelabelings",
        "honorLabels",
    },
    "relabel": {"sourceLabels", "separator", "regex", "targetLabel", "replacement", "action"},
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_nodes_export_metrics_where_the_annotations_point(overlay: str) -> None:
    cluster = rayservice(overlay)["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group, (name, template) in zip(groups, pod_templates(rayservice(overlay)).items()):
        assert group["rayStartParams"]["metrics-export-port"] == str(METRICS_PORT), name
        notes = template["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true", name
        assert int(notes["prometheus.io/port"]) == METRICS_PORT, name
        assert named_port(template["spec"]["containers"][0], "metrics") == METRICS_PORT, name


@pytest.fixture(scope="module")
def with_monitoring(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The dev overlay with the monitoring component added, as a user's overlay would."""
    root = tmp_path_factory.mktemp("monitored")
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "vaultvec",
                # Relative: kustomize refuses absolute roots.
                "resources": [os.path.relpath(K8S / "overlays" / "dev", root)],
                "components": [os.path.relpath(MONITORING, root)],
            }
        )
    )
    cmd = kustomize_command(root)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.load_all(proc.stdout, Loader=Loader) if d]


def unknown_fields(obj: dict[str, Any]) -> list[str]:
    spec = obj["spec"]
    bad = [f"/{k}" for k in set(obj) - PODMONITOR_FIELDS[""]]
    bad += [f"spec/{k}" for k in set(spec) - PODMONITOR_FIELDS["spec"]]
    for i, ep in enumerate(spec["podMetricsEndpoints"]):
        bad += [f"endpoint {i}/{k}" for k in set(ep) - PODMONITOR_FIELDS["endpoint"]]
        for rule in ep.get("relabelings", []) + ep.get("metricRelabelings", []):
            bad += [f"endpoint {i} rule/{k}" for k in set(rule) - PODMONITOR_FIELDS["relabel"]]
    return bad


def test_podmonitor_scrapes_every_ray_pod_as_vaultvec_series(
    with_monitoring: list[dict[str, Any]],
) -> None:
    (monitor,) = [o for o in with_monitoring if o["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "vaultvec"
    assert not unknown_fields(monitor), unknown_fields(monitor)
    (service,) = [o for o in with_monitoring if o["kind"] == "RayService"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    for name, template in pod_templates(service).items():
        assert wanted.items() <= template["metadata"]["labels"].items(), name
        port = named_port(template["spec"]["containers"][0], endpoint["port"])
        assert port == METRICS_PORT, name
    (rule,) = endpoint["metricRelabelings"]
    # Prometheus anchors the regex and expands $1 (Go's syntax; Python's \1 here).
    rename = re.compile(rule["regex"])
    assert rule["targetLabel"] == "__name__" and rule["sourceLabels"] == ["__name__"]
    found = rename.fullmatch("ray_vaultvec_requests_total")
    assert found and rule["replacement"].replace("$1", found.group(1)) == "vaultvec_requests_total"
    assert rename.fullmatch("ray_serve_num_http_requests_total") is None  # Ray's own kept as is


def test_podmonitor_field_check_rejects_a_misspelt_field(
    with_monitoring: list[dict[str, Any]],
) -> None:
    (monitor,) = [o for o in copy.deepcopy(with_monitoring) if o["kind"] == "PodMonitor"]
    monitor["spec"]["podMetricsEndpoints"][0]["metricRelabellings"] = []
    assert unknown_fields(monitor) == ["endpoint 0/metricRelabellings"]


GUARD_PATH = "/home/ray/anaconda3/bin/vaultvec-haproxy"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_containers_run_haproxy_through_the_guard(overlay: str) -> None:
    """HAProxy's admin socket private and its stats off the network on every node
    (cluster/haproxy_guard.py): the image's `vaultvec-haproxy`, whose path the Dockerfile
    checks when it builds."""
    for name, template in pod_templates(rayservice(overlay)).items():
        env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
        assert env.get(fastpath.BINARY) == GUARD_PATH, f"{overlay} {name}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f'"$(command -v vaultvec-haproxy)" = {GUARD_PATH}' in dockerfile


def test_prod_serves_https_with_the_tls_secret() -> None:
    """The tls component: every Ray container has the certificate of the Secret vaultvec-tls
    mounted read-only and named to HAProxy's guard; the workers' readiness probe speaks HTTPS."""
    for name, template in pod_templates(rayservice("prod")).items():
        spec = template["spec"]
        container = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == "vaultvec-tls", name
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        assert mount["readOnly"] is True, name
        for var, file in (("VAULTVEC_TLS_CERT", "tls.crt"), ("VAULTVEC_TLS_KEY", "tls.key")):
            assert env[var] == f"{mount['mountPath']}/{file}", f"{name}: {var}"
        assert volume["secret"]["defaultMode"] & 0o004 == 0, "the key readable by all"
        assert spec["securityContext"]["fsGroup"] == 100, name
        if name != "head":
            assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS", name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_containers_keep_full_vectors_on_local_disk(overlay: str) -> None:
    """ivf/ivfpq partitions' full vectors (actors.engine.fullvectors) go to an emptyDir on the
    node's disk, not memory (a memory-backed one would count them against the pod's limit),
    in every Ray container and beside the tls component's volume."""
    for name, template in pod_templates(rayservice(overlay)).items():
        spec = template["spec"]
        container = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        (volume,) = [v for v in spec["volumes"] if v["name"] == "vectors"]
        assert "medium" not in volume["emptyDir"], f"{overlay} {name}"
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "vectors"]
        assert env["VAULTVEC_VECTOR_DIR"] == mount["mountPath"], f"{overlay} {name}"
