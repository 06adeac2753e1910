"""Body parameter values checked where a bad one would only fail at the provider, hours later.

`check_values` runs on a job spec's `params` (and on each row's `param_columns` values):
every value against the SDK's type for its key (`shapes`), then what a type cannot say —
a tool's JSON Schema is a valid schema, `tool_choice` names a tool that exists, a
json_schema response format holds a valid schema, `n` and the output token limit are 1 or
more. Each error names the key (a path into it) and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lowtide.core import shapes
from lowtide.core.cards import routes_of
from lowtide.core.endpoints import PROTOCOL, body_type

# Routes that send a body of the endpoint's own protocol to the provider as it came
# (routes/openai/wire.py): a top-level key the installed SDK does not declare travels there as it
# is, as the SDKs' `extra_body` sends it. Elsewhere lowtide translates the body or runs it
# itself, and refuses such a key by name.
CARRYING_ROUTES = {protocol: routes_of(protocol) for protocol in ("openai", "anthropic", "gemini")}  # core/cards.py


def carries(route: str | None, endpoint: str) -> bool:
    """Whether `route` sends `endpoint`'s bodies to a provider of their protocol unchanged."""
    return route in CARRYING_ROUTES.get(PROTOCOL.get(endpoint, ""), ())

# Where each endpoint's tools keep their JSON Schema, and their name.
SCHEMA_PLACES = (("function", "parameters"), ("parameters",), ("input_schema",))
NAME_PLACES = (("function", "name"), ("custom", "name"), ("name",))
# Where a json_schema output format sits: chat completions, responses, Anthropic messages.
FORMAT_PLACES = (("response_format",), ("text", "format"), ("output_config", "format"))
# Output token limits, under each endpoint's name: a provider refuses one below 1.
OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# tool_choice values that ask for some tool when none is given.
NEEDS_A_TOOL = ("required", "any")


def check_values(params: dict[str, Any], endpoint: str, per_row: frozenset[str] = frozenset()) -> None:
    """Raise a ValueError for the first bad value; `per_row` keys come from each row, so the
    checks that relate keys (a tool_choice naming a tool) wait for the row."""
    types = shapes.fields(body_type(endpoint))
    for key, value in params.items():
        if key in types and value is not None:
            found = shapes.problem(value, types[key][0], key)
            if found is not None:
                raise ValueError(f"{found} (the SDK's type for {endpoint} `{key}`); fix the value")
    n = params.get("n")
    if n is not None and n < 1:
        raise ValueError(f"n: {n} choices asked; n is how many answers each request returns: 1 or more")
    for key in OUTPUT_LIMITS:
        limit = params.get(key)
        if type(limit) is int and limit < 1:
            raise ValueError(f"{key}: {limit} output tokens allows no answer; give 1 or more (or leave it out)")
    tools = params.get("tools")
    for i, tool in enumerate(tools or ()):
        for place in SCHEMA_PLACES:
            schema = _at(tool, place)
            if schema is not None:
                try:
                    check_schema(schema)
                except ValueError as err:
                    raise ValueError(f"tools[{i}].{'.'.join(place)}: not a valid JSON Schema: {err}; fix the tool's schema") from None
                break
    for path, schema in _formats(params):
        try:
            check_schema(schema)
        except ValueError as err:
            raise ValueError(f"{path}: not a valid JSON Schema: {err}; fix the schema (or use response_schema)") from None
    if not ({"tools", "tool_choice"} & per_row):
        _check_choice(params.get("tool_choice"), tools)


def check_row(values: dict[str, Any], base: dict[str, Any], endpoint: str) -> None:
    """One row's `param_columns` values (over the job's `base` body): their types, their
    schemas, and a tool_choice against the tools the row ends up with."""
    check_values(values, endpoint, per_row=frozenset({"tools", "tool_choice"}))
    if "tools" in values or "tool_choice" in values:
        merged = base | values
        _check_choice(merged.get("tool_choice"), merged.get("tools"))


def cast(text: str, kind: type | None) -> Any:
    """A CSV cell's text as the scalar the SDK's type names (`shapes.scalar`), or as it is."""
    text = text.strip()
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    if kind is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ValueError(f"{text!r} is not true or false")
    return text


def _check_choice(choice: Any, tools: list[dict[str, Any]] | None) -> None:
    names = [n for t in tools or () for n in [_name(t)] if n]
    wanted = _name(choice) if isinstance(choice, dict) else None
    asks = choice in NEEDS_A_TOOL or (isinstance(choice, dict) and (choice.get("type") in NEEDS_A_TOOL or wanted))
    if asks and not tools:
        raise ValueError(f"tool_choice: {choice!r} asks for a tool, but params has no `tools`; add the tools or remove tool_choice")
    if wanted and wanted not in names:
        raise ValueError(f'tool_choice: names the tool "{wanted}", but the tools are: {", ".join(names)}; fix the name')


def _name(tool: Any) -> str | None:
    for place in NAME_PLACES:
        name = _at(tool, place)
        if isinstance(name, str):
            return name
    return None


def _formats(params: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for place in FORMAT_PLACES:
        fmt = _at(params, place)
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            inner = fmt.get("json_schema", fmt)  # chat nests it one level deeper
            if isinstance(inner, dict) and "schema" in inner:
                yield ".".join(place) + (".json_schema" if inner is not fmt else "") + ".schema", inner["schema"]


def _at(value: Any, place: tuple[str, ...]) -> Any:
    for key in place:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def check_schema(schema: Any) -> None:
    """A ValueError unless `schema` is a valid JSON Schema whose every `$ref` resolves inside it."""
    import jsonschema  # here: a spec without a schema (and `lowtide compare`) never pays its import

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        raise ValueError(err.message) from None
    except RecursionError:  # the checker recurses several frames per level of the schema
        raise ValueError("nested too deep to check; flatten it, or name repeated parts in $defs") from None
    if isinstance(schema, dict):
        check_refs(schema)


def check_refs(schema: dict[str, Any]) -> None:
    """Every `$ref` must resolve inside the schema itself: one that does not would only show
    when the first answer is checked, and a remote one would be fetched at that moment."""
    # here, as jsonschema is: only when a schema is checked
    import referencing
    import referencing.exceptions
    from referencing.jsonschema import DRAFT202012

    resolver = referencing.Registry().resolver_with_root(
        referencing.Resource.from_contents(schema, default_specification=DRAFT202012)
    )

    def refs(node: Any):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    for ref in refs(schema):
        if not ref.startswith("#"):
            raise ValueError(f'$ref "{ref}" points outside the schema; put what it names under "$defs" and use "#/$defs/…"')
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise ValueError(f'$ref "{ref}" does not resolve: nothing at that place in the schema') from None
