"""Ordering plugins, calling hooks with timeouts and error isolation, and the post_execute queue."""

from __future__ import annotations

import asyncio
import graphlib
import heapq
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

from ringlet import telemetry
from ringlet.context import RunContext
from ringlet.errors import PluginOrderError, RunError, ToolDefinitionError
from ringlet.hooks.plugin import (
    HOOKS,
    OPEN_SCHEMA,
    ActionResult,
    ActionSpec,
    HookContext,
    Plugin,
    PostExecuteContext,
    PreExecuteContext,
    PreExecuteResult,
    PrePromptContext,
)
from ringlet.tools.base import DEFAULT_TIMEOUT_S, ArgumentsInvalid, Tool, Toolset

log = logging.getLogger("ringlet.hooks")

HOOK_TIMEOUT_S = 5.0
QUEUE_SIZE = 256
QUEUE_WORKERS = 4


def order_plugins(plugins: Sequence[Plugin]) -> list[Plugin]:
    """Topological order over `before`/`after`; ties: core first, higher priority, then name."""
    by_name: dict[str, Plugin] = {}
    for p in plugins:
        if p.name in by_name:
            raise PluginOrderError(f"two plugins are named {p.name!r}; plugin names must be unique")
        by_name[p.name] = p
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter({name: () for name in by_name})
    for p in plugins:
        for ref, edge in [*((r, (p.name, r)) for r in p.before), *((r, (r, p.name)) for r in p.after)]:
            if ref not in by_name:
                log.warning("plugin %r refers to %r, which is not loaded; ignoring that constraint", p.name, ref)
                continue
            first, then = edge
            sorter.add(then, first)
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise PluginOrderError(f"plugin ordering cycle: {cycle}; remove one `before`/`after` link") from None

    def key(name: str) -> tuple[bool, int, str]:
        p = by_name[name]
        return (not p.core, -p.priority, name)

    ready = [key(n) for n in sorter.get_ready()]
    heapq.heapify(ready)
    ordered: list[Plugin] = []
    while ready:
        name = heapq.heappop(ready)[2]
        ordered.append(by_name[name])
        sorter.done(name)
        for n in sorter.get_ready():
            heapq.heappush(ready, key(n))
    return ordered


class Hooks:
    """The ordered plugins, indexed per hook so that an unused hook costs one empty-tuple check."""

    def __init__(self, plugins: Sequence[Plugin], *, timeout_s: float = HOOK_TIMEOUT_S,
                 strict: bool = False) -> None:
        self.plugins = order_plugins(plugins)
        self.timeout_s = timeout_s
        self.strict = strict
        self.by_hook: dict[str, tuple[Plugin, ...]] = {
            hook: tuple(p for p in self.plugins if getattr(type(p), hook) is not getattr(Plugin, hook))
            for hook in HOOKS
        }

    def has(self, hook: str) -> bool:
        return bool(self.by_hook[hook])

    async def _call(self, plugin: Plugin, hook: str, ctx: HookContext) -> tuple[bool | None, Any]:
        """Await one hook call under the timeout. Returns (ok, value): ok is True, None for a timeout (the
        call is skipped) or False for an exception; both become warnings."""
        ctx.source = plugin.name
        ok: bool | None = False
        try:
            async with asyncio.timeout(self.timeout_s):
                return True, await getattr(plugin, hook)(ctx)
        except TimeoutError:
            ok, problem = None, f"timed out after {self.timeout_s:g} s"
        except Exception as exc:
            log.exception("plugin %r failed in %s", plugin.name, hook)
            problem = f"{type(exc).__name__}: {exc}"
        telemetry.emit("ringlet.plugin.error", {}, {"plugin": plugin.name, "hook": hook, "error": problem})
        if self.strict:
            raise RunError("plugin_error", f"plugin {plugin.name!r} failed in {hook}: {problem}",
                           details={"plugin": plugin.name, "hook": hook})
        ctx.run.notify("warning", f"plugin {plugin.name} failed in {hook}", problem, source=plugin.name)
        return ok, None

    async def fire(self, hook: str, ctx: HookContext) -> None:
        """Call every plugin implementing `hook`, in order. pre_prompt stops at the first cancel()."""
        for plugin in self.by_hook[hook]:
            await self._call(plugin, hook, ctx)
            if isinstance(ctx, PrePromptContext) and ctx.cancel_reason is not None:
                return

    async def pre_execute(self, ctx: PreExecuteContext) -> tuple[dict[str, Any], str | None, str | None]:
        """Run the pre_execute chain: (final params, abort message or None, aborting plugin or None)."""
        for plugin in self.by_hook["pre_execute"]:
            ok, result = await self._call(plugin, "pre_execute", ctx)
            if ok is None:  # timed out: skipped with a warning
                continue
            if not ok:  # raised: that one call is aborted
                return ctx.params, f"pre_execute hook of plugin {plugin.name!r} failed", plugin.name
            if ctx.cancel_reason is not None:
                return ctx.params, ctx.cancel_reason, plugin.name
            if isinstance(result, PreExecuteResult):
                if result.modified_params is not None:
                    ctx.params = result.modified_params
                if not result.proceed:
                    return ctx.params, result.abort_message or f"aborted by plugin {plugin.name!r}", plugin.name
        return ctx.params, None, None


class BackgroundQueue:
    """A bounded queue drained by a few workers; the producer never waits (full means dropped)."""

    def __init__(self, size: int = QUEUE_SIZE, workers: int = QUEUE_WORKERS) -> None:
        self.queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue(size)
        self.dropped = 0
        self.workers = [asyncio.get_running_loop().create_task(self._work()) for _ in range(workers)]

    def submit(self, job: Callable[[], Awaitable[None]]) -> bool:
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("post_execute queue is full; dropped one job (%d dropped so far)", self.dropped)
            return False
        return True

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            try:
                await job()
            except Exception:
                log.exception("background job failed")
            finally:
                self.queue.task_done()

    async def join(self) -> None:
        """Wait until every queued job has run (tests and shutdown use this)."""
        await self.queue.join()


def post_execute_job(hooks: Hooks, ctx: PostExecuteContext) -> Callable[[], Awaitable[None]]:
    async def job() -> None:
        await hooks.fire("post_execute", ctx)

    return job


class PluginActions(Toolset):
    """A plugin's `@action` methods as tools named `<plugin>_<action>` (default effect: write)."""

    def __init__(self, plugin: Plugin) -> None:
        self.label = f"plugin {plugin.name!r}"
        self.static_tools = tuple(self._tool(plugin, spec) for spec in plugin.actions)

    @staticmethod
    def _tool(plugin: Plugin, spec: ActionSpec) -> Tool:
        schema = spec.input_schema or OPEN_SCHEMA
        from jsonschema.exceptions import SchemaError

        try:
            validate = schema_validator(schema)
        except SchemaError as exc:
            raise ToolDefinitionError(
                f"plugin {plugin.name!r}, action {spec.name!r}: input_schema is not a valid JSON Schema: "
                f"{getattr(exc, 'message', exc)}") from None

        async def run(args: dict[str, Any], ctx: RunContext) -> Any:
            result = await spec.method(plugin, args, ctx)
            return asdict(result) if isinstance(result, ActionResult) else result  # JSON-encoded by the loop

        return Tool(name=f"{plugin.name}_{spec.name}", description=spec.description, parameters=schema,
                    run=run, validate=validate, effect=spec.effect,
                    timeout_s=DEFAULT_TIMEOUT_S if spec.timeout_s is None else spec.timeout_s)


def schema_validator(schema: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A validator for tools described by a raw JSON Schema (plugin actions, MCP tools)."""
    from jsonschema.validators import validator_for

    validator_cls = validator_for(schema)
    validator_cls.check_schema(schema)
    validator = validator_cls(schema)

    def validate(args: dict[str, Any]) -> dict[str, Any]:
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            raise ArgumentsInvalid([f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                                    for e in errors])
        return args

    return validate
