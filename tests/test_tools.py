"""`@tool`: schemas from type hints and docstrings, validation, and definition errors."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel

from ringlet import Agent, ConfigError, RunContext, Tool, ToolDefinitionError, tool
from ringlet.testing import ScriptedModel


class Address(BaseModel):
    street: str
    zip_code: str


def test_schema_comes_from_hints_and_docstring() -> None:
    @tool(timeout_s=5, effect="read", sequential=True)
    def find(query: str, limit: int = 10, mode: Literal["fast", "exact"] = "fast",
             where: Address | None = None) -> list[str]:
        """Search the catalogue.

        Longer explanation.

        Args:
            query: What to look for.
            limit: How many results at most.
        """
        return []

    assert isinstance(find, Tool)
    assert (find.name, find.timeout_s, find.effect, find.sequential) == ("find", 5, "read", True)
    assert find.description == "Search the catalogue.\n\nLonger explanation."
    params = find.parameters
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {"type": "string", "description": "What to look for."}
    assert params["properties"]["limit"] == {"type": "integer", "default": 10,
                                             "description": "How many results at most."}
    assert params["properties"]["mode"]["enum"] == ["fast", "exact"]
    assert "Address" in params["$defs"]
    assert params["additionalProperties"] is False


def test_validation_coerces_and_rejects() -> None:
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add."""
        return a + b

    assert add.validate({"a": "2"}) == {"a": 2, "b": 1}
    from ringlet.tools import ArgumentsInvalid

    with pytest.raises(ArgumentsInvalid) as err:
        add.validate({"a": "x", "c": 1})
    assert err.value.errors == ["a: Input should be a valid integer, unable to parse string as an integer",
                                "c: Extra inputs are not permitted"]


def test_options_name_and_description() -> None:
    @tool(name="lookup", description="Custom.")
    def f(x: str) -> str:
        """Ignored."""
        return x

    assert (f.name, f.description) == ("lookup", "Custom.")


def test_a_missing_annotation_names_the_tool_and_parameter() -> None:
    with pytest.raises(ToolDefinitionError, match="tool 'f': parameter 'x' has no type annotation"):
        @tool
        def f(x) -> str:  # type: ignore[no-untyped-def]
            return ""


def test_a_type_without_schema_names_the_parameter() -> None:
    class Opaque:
        pass

    def g(thing: Opaque) -> str:
        return ""

    g.__annotations__["thing"] = Opaque
    with pytest.raises(ToolDefinitionError, match="tool 'g': parameter 'thing' cannot become a JSON Schema"):
        tool(g)


def test_varargs_are_rejected() -> None:
    with pytest.raises(ToolDefinitionError, match="parameter 'rest' is \\*args"):
        @tool
        def h(*rest: str) -> str:
            return ""


def test_invalid_tool_names_are_rejected() -> None:
    with pytest.raises(ToolDefinitionError, match="tool name 'bad name'"):
        tool(name="bad name")(lambda: "")


def test_the_context_parameter_is_not_in_the_schema() -> None:
    @tool
    def uses(ctx: RunContext, x: int) -> int:
        """u"""
        return x

    assert list(uses.parameters["properties"]) == ["x"]
    assert uses.takes_context


def test_plain_functions_become_tools_and_duplicates_are_errors() -> None:
    def hello(name: str) -> str:
        """Say hello."""
        return f"hi {name}"

    agent = Agent(ScriptedModel([]), tools=[hello])
    assert agent.toolsets[0].static_tools[0].name == "hello"
    with pytest.raises(ConfigError, match="'hello' is defined twice"):
        Agent(ScriptedModel([]), tools=[hello, tool(hello)])
    with pytest.raises(ConfigError, match="tools must be"):
        Agent(ScriptedModel([]), tools=[42])


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tool names `function_tool` builds a schema for (rather than taking it from its cache)."""
    from ringlet.tools import function

    built: list[str] = []
    build = function._build_spec

    def counting(fn, name):  # type: ignore[no-untyped-def]
        built.append(name)
        return build(fn, name)

    monkeypatch.setattr(function, "_build_spec", counting)
    return built


def test_agents_built_from_one_function_share_its_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _count_builds(monkeypatch)

    def hello(name: str, loud: bool = False) -> str:
        """Say hello.

        Args:
            name: Whom to greet.
        """
        return f"hi {name}"

    agents = [Agent(ScriptedModel([]), tools=[hello]) for _ in range(2)]
    first, second = (t for a in agents for t in a.toolsets[0].static_tools or ())
    assert built == ["hello"]
    assert first is not second
    assert first.parameters is second.parameters
    assert first.parameters == {"additionalProperties": False, "type": "object", "required": ["name"],
                                "properties": {"name": {"type": "string", "description": "Whom to greet."},
                                               "loud": {"type": "boolean", "default": False}}}
    assert second.validate({"name": "Ann", "loud": "yes"}) == {"name": "Ann", "loud": True}
    renamed = tool(name="greet", description="Custom.", effect="read")(hello)
    assert built == ["hello", "greet"]  # the name is in the key: it is in the error messages
    assert (renamed.description, renamed.effect, renamed.parameters) == ("Custom.", "read", first.parameters)


def test_bound_methods_share_the_schema_of_their_function(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _count_builds(monkeypatch)

    class Greeter:
        def __init__(self, greeting: str) -> None:
            self.greeting = greeting

        async def greet(self, ctx: RunContext, name: str) -> str:
            """Greet someone."""
            return f"{self.greeting} {name}"

    tools = [tool(Greeter(g).greet) for g in ("hi", "hello")]
    assert built == ["greet"]
    assert list(tools[0].parameters["properties"]) == ["name"]
    assert tools[0].takes_context
    assert tools[0].parameters is tools[1].parameters
    with pytest.raises(ToolDefinitionError, match="parameter 'self' has no type annotation"):
        tool(Greeter.greet)  # the function itself, `self` included: an entry of its own
    assert built == ["greet", "greet"]


def test_a_bad_signature_fails_every_time_with_its_message(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _count_builds(monkeypatch)

    class Opaque:
        pass

    def g(thing: Opaque) -> str:
        return ""

    g.__annotations__["thing"] = Opaque
    messages = []
    for _ in range(2):
        with pytest.raises(ToolDefinitionError, match="tool 'g': parameter 'thing' cannot become a JSON Schema") \
                as err:
            Agent(ScriptedModel([]), tools=[g])
        messages.append(str(err.value))
    assert built == ["g"]
    assert messages[0] == messages[1]

    def f(x) -> str:  # type: ignore[no-untyped-def]
        return ""

    for _ in range(2):
        with pytest.raises(ToolDefinitionError, match="tool 'f': parameter 'x' has no type annotation"):
            tool(f)
    assert built == ["g", "f"]


def test_the_cache_does_not_keep_functions_alive() -> None:
    import gc
    import weakref

    def make() -> tuple[Tool, weakref.ref[Any]]:
        def short_lived(x: int) -> int:
            """Used once."""
            return x

        return tool(short_lived), weakref.ref(short_lived)

    def make_bad() -> weakref.ref[Any]:
        def opaque(x: object) -> str:
            return ""

        opaque.__annotations__["x"] = type("Opaque", (), {})
        with pytest.raises(ToolDefinitionError):
            tool(opaque)
        return weakref.ref(opaque)

    made, ref = make()
    assert made.validate({"x": "1"}) == {"x": 1}
    assert ref() is not None
    del made
    bad = make_bad()
    gc.collect()
    assert ref() is None
    assert bad() is None
