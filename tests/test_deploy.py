"""The deployment files in deploy/ (issue 55, point 6). No container runtime here can pull a base image, so:
the compose file's services run as local processes, with its commands and environment (PostgreSQL from
tests/postgres.py standing in for the postgres image), and hold a conversation; every Kubernetes manifest is
built into the `kubernetes` client's models, failing on any field they do not have, and the KEDA
ScaledObject (a CRD the client does not know) is checked against a JSON Schema written from KEDA's docs; the
Containerfile's stages, user and extras are checked against the checkout; the deployment guide includes
these very files."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import jsonschema
import kubernetes.client
import pytest
import typer
import yaml
from httpx_sse import aconnect_sse

from processes import free_port, ringlet_process
from ringlet.cli import app as cli_app
from ringlet.store import Store
from serving import openai_model, serving

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KEDA_SCHEMA = Path(__file__).parent / "fixtures" / "deploy" / "keda-scaledobject.schema.json"
PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool, "object": object, "datetime": str,
              "date": str, "bytes": str}


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """Every object in deploy/k8s/*.yaml, named `file#index kind/name`."""
    found = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            found.append((f"{path.name}#{i} {doc['kind']}/{doc['metadata']['name']}", doc))
    return found


# -- Kubernetes: the API's own models -----------------------------------------------------------------------


def build(data: Any, type_name: str, where: str) -> Any:
    """`data` (a manifest's part) as the kubernetes client's model `type_name`, every field checked: a field the
    model does not have, a value of the wrong kind or a required field left out fails, naming where."""
    if type_name.lower().startswith("list["):  # `List[V1Container]` (older clients: `list[…]`)
        assert isinstance(data, list), f"{where}: a list expected, not {data!r}"
        return [build(item, type_name[5:-1], f"{where}[{i}]") for i, item in enumerate(data)]
    if type_name.lower().startswith(("dict[", "dict(")):  # `Dict[str, str]` (older: `dict(str, str)`)
        assert isinstance(data, dict), f"{where}: a mapping expected, not {data!r}"
        inner = type_name[5:-1].split(",", 1)[1].strip()
        return {key: build(value, inner, f"{where}.{key}") for key, value in data.items()}
    if type_name in PRIMITIVES:
        assert isinstance(data, PRIMITIVES[type_name]), f"{where}: a {type_name} expected, not {data!r}"
        return data
    model = getattr(kubernetes.client, type_name)
    assert isinstance(data, dict), f"{where}: a {type_name} (mapping) expected, not {data!r}"
    unknown = sorted(set(data) - set(model.attribute_map.values()))
    assert not unknown, f"{where}: {type_name} has no field {', '.join(unknown)}"
    given = {attr: build(data[key], model.openapi_types[attr], f"{where}.{key}")
             for attr, key in model.attribute_map.items() if key in data}
    try:
        return model(**given)
    except ValueError as exc:  # a required field is missing
        raise AssertionError(f"{where}: {exc}") from None


def model_of(doc: dict[str, Any]) -> str:
    """The client's model of a manifest: `apps/v1` `Deployment` → `V1Deployment`."""
    version = doc["apiVersion"].rsplit("/", 1)[-1]
    return f"{version[0].upper()}{version[1:]}{doc['kind']}"


@pytest.mark.parametrize("name", [n for n, doc in manifests() if doc["apiVersion"] != "keda.sh/v1alpha1"])
def test_each_manifest_is_a_kubernetes_object_with_no_unknown_field(name: str) -> None:
    doc = dict(manifests())[name]
    built = build(doc, model_of(doc), name)
    assert built.kind == doc["kind"]


def test_a_misspelt_or_misplaced_field_fails_the_check() -> None:
    deployment = next(doc for _, doc in manifests() if doc["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for broken in ({**container, "livenesProbe": container["livenessProbe"]},
                   {**container, "ports": [{"containerPort": "8000"}]}, {k: v for k, v in container.items()
                                                                         if k != "name"}):
        bad = {**deployment, "spec": {**deployment["spec"], "template": {**deployment["spec"]["template"], "spec": {
            **deployment["spec"]["template"]["spec"], "containers": [broken]}}}}
        with pytest.raises(AssertionError, match="containers"):
            build(bad, "V1Deployment", "bad")


def test_the_keda_scaled_object_follows_kedas_schema_and_scales_the_workers_on_queue_depth() -> None:
    schema = json.loads(KEDA_SCHEMA.read_text())
    scaled = [doc for _, doc in manifests() if doc["kind"] == "ScaledObject"]
    assert len(scaled) == 1
    jsonschema.validate(scaled[0], schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict: it can fail
        jsonschema.validate({**scaled[0], "spec": {**scaled[0]["spec"], "minReplicas": 1}}, schema)
    deployments = {doc["metadata"]["name"]: doc for _, doc in manifests() if doc["kind"] == "Deployment"}
    target = deployments[scaled[0]["spec"]["scaleTargetRef"]["name"]]
    assert target["spec"]["template"]["spec"]["containers"][0]["args"][0] == "worker"
    query = scaled[0]["spec"]["triggers"][0]["metadata"]["query"]
    assert re.search(r"\bringlet_queue_depth\b", query)


def _pods(selector: dict[str, str]) -> list[str]:
    """The Deployments whose pods `selector` selects."""
    return [doc["metadata"]["name"] for _, doc in manifests() if doc["kind"] == "Deployment"
            and selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()]


def test_the_manifests_fit_together_and_drain_within_their_grace_period() -> None:
    docs = [doc for _, doc in manifests()]
    deployments = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Deployment"}
    assert {d["spec"]["template"]["spec"]["containers"][0]["args"][0] for d in deployments.values()} == \
        {"serve", "worker"}
    routes = {getattr(r, "path", None) for r in _app_routes()}
    for name, deployment in deployments.items():
        spec = deployment["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(), name
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        container = pod["containers"][0]
        _parses(container["args"])
        drain_s = float(next(e["value"] for e in container["env"] if e["name"] == "RINGLET_DRAIN_S"))
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        assert pod["terminationGracePeriodSeconds"] > pre_stop + drain_s, name  # the drain is never cut short
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["path"] in routes
    api = deployments["ringlet-api"]["spec"]["template"]["spec"]["containers"][0]
    assert (api["livenessProbe"]["httpGet"]["path"], api["readinessProbe"]["httpGet"]["path"]) == ("/livez", "/readyz")
    assert "preStop" in api["lifecycle"]
    for doc in docs:
        if doc["kind"] == "Service":
            assert _pods(doc["spec"]["selector"]) == ["ringlet-api"]
        elif doc["kind"] == "PodDisruptionBudget":
            assert _pods(doc["spec"]["selector"]["matchLabels"]) == [doc["metadata"]["name"]]
        elif doc["kind"] == "HorizontalPodAutoscaler":
            assert doc["spec"]["scaleTargetRef"]["name"] == "ringlet-api"
            assert doc["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    job = next(doc for doc in docs if doc["kind"] == "Job")
    _parses(job["spec"]["template"]["spec"]["containers"][0]["args"])


def _app_routes() -> list[Any]:
    from ringlet.server import ServerSettings, create_app

    return create_app(ServerSettings(auth_mode="none"), agents=[]).routes


def _parses(args: list[str]) -> None:
    """`ringlet ARGS` names a command and options it has (Click parses them; nothing runs)."""
    command: Any = typer.main.get_command(cli_app)
    words = list(args)
    while hasattr(command, "commands") and words and words[0] in command.commands:
        command = command.commands[words.pop(0)]
    assert not hasattr(command, "commands"), f"`ringlet {' '.join(args)}` names no command"
    command.make_context("ringlet", words)


# -- the Containerfile ----------------------------------------------------------------------------------------


def test_the_containerfile_builds_in_two_stages_and_runs_as_a_user() -> None:
    lines = [line.strip() for line in (DEPLOY / "Containerfile").read_text().splitlines()]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) == 2
    assert stages[0].endswith(" AS build")
    final = lines[lines.index(stages[1]):]
    assert any(line.startswith("COPY --from=build ") for line in final)
    user = next(line for line in final if line.startswith("USER ")).split()[1]
    assert user.split(":")[0] not in ("0", "root")
    assert next(line for line in final if line.startswith("ENTRYPOINT ")) == 'ENTRYPOINT ["ringlet"]'
    sources = [word for line in lines if line.startswith("COPY ") and "--from" not in line
               for word in line.split()[1:-1]]
    assert sources
    assert all((ROOT / source).exists() for source in sources), sources
    extras = re.search(r"ARG EXTRAS=(\S+)", "\n".join(lines))
    assert extras is not None
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras[1].split(",")) | {"local"} <= set(declared)  # `local`: the model, with WITH_MODEL=true
    assert "ARG WITH_MODEL=false" in lines


# -- compose: its services as local processes -------------------------------------------------------------------


def test_the_deployment_guide_includes_these_very_files() -> None:
    guide = (ROOT / "docs" / "how-to" / "deploy.md").read_text()
    included = set(re.findall(r'--8<-- "([^"]+)"', guide))
    files = {str(p.relative_to(ROOT)) for p in DEPLOY.rglob("*") if p.is_file()}
    assert included == files
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Tolerant)
    assert "pymdownx.snippets" in json.dumps(config["markdown_extensions"])
    assert "how-to/deploy.md" in json.dumps(config["nav"])


class _Tolerant(yaml.SafeLoader):
    """mkdocs.yml's tags (`!ENV`, `!!python/name:`) read as plain values."""


_Tolerant.add_multi_constructor("", lambda loader, suffix, node: None)


def _local(service: dict[str, Any], db: str, agents: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """A compose service's command and environment for a local process: what its container has (the database
    at host `postgres`, the agents volume, its port, every address) mapped to this machine's."""
    env = dict(service["environment"])
    url = urlsplit(env["RINGLET_DB_URL"])
    postgres = compose()["services"]["postgres"]["environment"]
    assert (url.hostname, url.username, url.password, url.path.lstrip("/")) == (
        "postgres", postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"])
    env["RINGLET_DB_URL"] = db
    mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in service["volumes"]}
    assert mounted[env["RINGLET_AGENTS_DIR"]] == "./agents"
    env["RINGLET_AGENTS_DIR"] = str(agents)
    command = list(service["command"])
    _parses(command)
    if "--port" in command:
        given = command[command.index("--port") + 1]
        assert [p.split(":")[1] for p in service["ports"]] == [given]
        assert f":{given}/" in " ".join(service["healthcheck"]["test"])
        command[command.index("--port") + 1] = str(port)
        command[command.index("--host") + 1] = "127.0.0.1"
    if "--metrics-port" in command:  # each local process its own (each container has its own network)
        command[command.index("--metrics-port") + 1] = str(free_port())
    return command, env


@asynccontextmanager
async def _empty_database(server_url: str) -> AsyncIterator[str]:
    """A database with nothing in it (not the migrated template): the migrate job has work to do."""
    dsn = server_url.replace("postgresql+asyncpg://", "postgresql://")
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute("CREATE DATABASE compose_test")
        yield server_url.rsplit("/", 1)[0] + "/compose_test"
    finally:
        await admin.execute("DROP DATABASE IF EXISTS compose_test WITH (FORCE)")
        await admin.close()


async def _healthcheck(test: list[str], port: int, env: dict[str, str]) -> int:
    """Run a compose healthcheck's command (`CMD …`) here, aimed at the local process's port."""
    assert test[0] == "CMD"
    words = [word.replace(":8000/", f":{port}/") for word in test[1:]]
    words[0] = sys.executable if words[0] == "python" else words[0]
    process = await asyncio.create_subprocess_exec(*words, env={**os.environ, **env})
    return await process.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_compose_services_run_as_local_processes_and_hold_a_conversation(tmp_path: Path,
                                                                                     postgres_url: str) -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "migrate", "api-1", "api-2", "worker"}
    agents = tmp_path / "agents"
    (agents / "helper").mkdir(parents=True)
    model = openai_model(lambda messages: [{"role": "assistant", "content": ""}, {"content": "Hello from "},
                                           {"content": "the cluster"}])
    async with AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(serving(model))
        (agents / "helper" / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\ninstructions: Help.\n")
        db = await stack.enter_async_context(_empty_database(postgres_url))
        command, env = _local(services["migrate"], db, agents, 0)  # the job: runs to its end, first
        migrate = await asyncio.create_subprocess_exec(sys.executable, "-m", "ringlet", *command,
                                                       env={**os.environ, **env})
        assert await migrate.wait() == 0
        conn = await asyncpg.connect(db.replace("postgresql+asyncpg://", "postgresql://"))
        try:  # the schema is there before any process starts
            assert await conn.fetchval("SELECT count(*) FROM runs") == 0
        finally:
            await conn.close()
        ports: dict[str, int] = {}
        starting = []
        for name in ("api-1", "api-2"):
            ports[name] = free_port()
            command, env = _local(services[name], db, agents, ports[name])
            starting.append(ringlet_process(command, b"Uvicorn running on", env, forked=False))  # as deployed
        workers = [_local(services["worker"], db, agents, 0) for _ in range(services["worker"]["deploy"]["replicas"])]
        starting += [ringlet_process(command, b"ready", env, forked=False) for command, env in workers]
        await asyncio.gather(*[stack.enter_async_context(process) for process in starting])
        for name, port in ports.items():  # the probes: alive, and ready (the healthcheck's own command)
            assert await _healthcheck(services[name]["healthcheck"]["test"], port, env) == 0
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as probe:
                assert (await probe.get("/livez")).status_code == 200
        store = await Store.open(db)
        try:
            key, _ = await store.keys.create("compose", scopes=["chat"])
        finally:
            await store.close()
        headers = {"Authorization": f"Bearer {key}"}
        one, two = (httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[n]}", headers=headers, timeout=60)
                    for n in ("api-1", "api-2"))
        async with one, two:
            cid = (await one.post("/api/v1/chat/conversations", json={"agent": "helper"})).json()["id"]
            seen = []
            async with aconnect_sse(two, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "Hi"}) as source:
                assert source.response.status_code == 200
                async for event in source.aiter_sse():
                    if event.event != "ping":
                        seen.append((event.event, json.loads(event.data)))
                    if event.event == "message_end":
                        break
            assert seen[-1][1]["finish_reason"] == "end_turn"
            assert "".join(d["delta"] for kind, d in seen if kind == "content_delta") == "Hello from the cluster"
            for command, _ in workers:  # each worker's /metrics, on its own port, without a key
                port = command[command.index("--metrics-port") + 1]
                async with httpx.AsyncClient() as scraper:
                    scraped = await scraper.get(f"http://127.0.0.1:{port}/metrics")
                assert scraped.status_code == 200
                assert "ringlet_queue_depth" in scraped.text
            transcript = (await one.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
            assert [(m["role"], m["content"]) for m in transcript] == [("user", "Hi"),
                                                                       ("assistant", "Hello from the cluster")]
