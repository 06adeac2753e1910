"""`echo`: an instant, deterministic direct route for dry runs, tests and benchmarks.

It is not a model. Its answer is a documented function of the request, so a user can dry-run
a schema or tools job offline and see it succeed. In this order:

- a tool call is required (`tool_choice` `required`, a named function or `allowed_tools`
  with mode `required`; Anthropic `any` or `tool`): a call to the named tool, else to
  `tools[crc32(custom_id) % len(tools)]`, whose arguments are a deterministic instance of the
  tool's parameters schema (`instances.py`), finish reason `tool_calls`;
- the answer must be JSON (`response_format` / `text.format` / `output_config.format`
  json_schema, Gemini's `responseJsonSchema` / `responseSchema`, or lowtide's
  `response_schema`): a deterministic instance valid against the schema, derived from
  `custom_id`; json_object with no schema: `{"echo": <the text below>}`; a schema of the
  shape lowtide asks `choices` in (`{"choice": <enum>}`, core/native_schema.py):
  `{"choice": <the choice picked as below>}`;
- with `choices` (or Gemini's `text/x.enum` and its enum): the first choice that appears
  (case-insensitive) in the last user message, else `choices[crc32(custom_id) % len(choices)]`;
- otherwise: the last user message, cut to the request's output limit × 4 characters (finish
  reason `length` when it was cut; a JSON answer or a tool call is never cut).

`tools` with `tool_choice` auto or none (or absent) are accepted and not called. Each tool's
parameters must be a valid JSON Schema; one echo cannot make an instance of (a `pattern`, a
`not`, ...) is refused by name where it could be called, as is a schema it cannot satisfy.

Parameters that change nothing here, since echo is deterministic anyway: `seed`, `top_p`,
`parallel_tool_calls` (echo makes one call), Anthropic's top-level `cache_control` (a
caching hint). `service_tier` is reported back in the answer, as OpenAI does (`auto` as
`default`). `n` (chat, completions): n choices; choice 0 is
the n = 1 answer, choice i draws its instance, tool and choice from `custom_id#i`; a text
echo is the same in every choice. Everything else plain-text turns cannot say is refused by
name (`plain.py`).

On `/v1/embeddings`: deterministic unit vectors from a BLAKE2b of each input (`echo_embed.py`).
On `/v1/moderations`: a verdict that flags nothing, every category the SDK declares, scores
from the custom_id (`echo_moderate.py`).

`Outcome.response` is the answer in the endpoint's own shape (`routes/replies.py`): a chat
completion (with `tool_calls`), a response (a `function_call` output item), a completion, or
an Anthropic message (a `tool_use` block). `Outcome.text` is choice 0's text ("" for a tool
call, but a call of lowtide's forced tool, whose input is the answer: core/native_schema.py);
`Outcome.finish_reason` is in chat's words (stop, length, tool_calls).

Usage is counted as characters / 4 (rounded up): input over all messages, output over every
choice's text or tool arguments.

Options (for tests of retry paths): `fail_attempts: {custom_id: n}` makes the first n attempts
of that request fail with a retryable `server_error`; `reject: [custom_id, …]` fails those
requests permanently with `invalid_request`. `answer: message` (for tests of lowtide's own
answer checks) answers the last user message even where JSON is asked, as before schemas were
honoured, so a row can carry an invalid answer; the default is `answer: instance`.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import orjson

from lowtide.core.endpoints import CHAT, COMPLETIONS, GEMINI, MESSAGES, RESPONSES
from lowtide.core.errors import RouteError
from lowtide.core.native_schema import CHOICE_KEY, FORCED_TOOL, choices_of
from lowtide.core.types import Outcome, Refusal, Request, Usage, WrittenOutcome
from lowtide.routes.options import number_option, texts_option
from lowtide.routes.own import echo_embed as _echo_embed
from lowtide.routes.own import echo_moderate as _echo_moderate
from lowtide.routes.own.instances import Instances, Unsatisfiable, instances_for
from lowtide.routes.own.plain import CHAT_ROLES, Plain, read_plain
from lowtide.routes.own.structure import (
    GEMINI_STRUCTURE,
    JsonAsk,
    Tool,
    json_ask,
    required_call,
    tools,
)
from lowtide.routes.replies import (
    Call,
    Reply,
    arguments_text,
    chat_finish,
    chat_text_written,
    reply_body,
)

KNOWN_OPTIONS = {"fail_attempts", "reject", "dispatch_size", "answer"}
ANSWERS = ("instance", "message")
# Beyond plain-text turns, per endpoint (see the module doc for what each does).
HONOURS = {
    CHAT: frozenset({"response_format", "tools", "tool_choice", "parallel_tool_calls", "seed", "top_p", "n", "service_tier"}),
    RESPONSES: frozenset({"text", "tools", "tool_choice", "parallel_tool_calls", "top_p", "service_tier"}),
    COMPLETIONS: frozenset({"seed", "top_p", "n"}),
    MESSAGES: frozenset({"output_config", "tools", "tool_choice", "cache_control"}),
}


def _tokens(text: str) -> int:
    return -(-len(text) // 4)


def _last_user(plain: Plain) -> str:
    return next((m["content"] for m in reversed(plain.messages) if m["role"] == "user"), "")


# The keys of the commonest body by far (a rendered template: text turns and a limit).
TEXT_CHAT_KEYS = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "stop"})


def text_chat(request: Request) -> tuple[str, int, int | None] | None:
    """For a chat request that echo answers with the text echo and that nothing in it can
    refuse (text turns, a limit of at least 1, a temperature from 0 to 2, text stops; no structure asked, no choices,
    one choice), told in a few lookups: its last user turn, its input tokens and its output
    limit. None for any other request, which is planned the general way. The answer is the
    general way's, byte for byte (tests/routes/test_echo_short_ways.py)."""
    body = request.body
    if request.endpoint != CHAT or request.choices or request.response_schema is not None or not TEXT_CHAT_KEYS.issuperset(body):
        return None
    return _plain_chat(body)


# A rendered template of a job with choices: the text chat's keys and lowtide's own ask.
CHOICE_CHAT_KEYS = TEXT_CHAT_KEYS | {"response_format"}


def choice_chat(request: Request) -> tuple[str, int, list[str]] | None:
    """For a chat request whose `response_format` is a json_schema of lowtide's choice shape
    (`{"choice": <enum>}`, core/native_schema.py: what a job with `choices` sends) and that
    nothing in it can refuse (otherwise as `text_chat`), told in a few lookups: its last user
    turn, its input tokens and the schema's choices. Such a body asks nothing else of the
    structure (no tools), so its plan is `Plan(plain, ask, None, [], picks)` and its answer
    the choice picked from the schema's enum (never the request's own `choices`, as in
    `replies`), never cut. None for any other request, which is planned the general way; echo
    takes it only with `answer: instance`. The answer is the general way's, byte for byte
    (tests/routes/test_echo_short_ways.py)."""
    body = request.body
    if request.endpoint != CHAT or not CHOICE_CHAT_KEYS.issuperset(body):
        return None
    fmt = body.get("response_format")
    spec = fmt.get("json_schema") if fmt.__class__ is dict and fmt.get("type") == "json_schema" else None
    if spec.__class__ is not dict or "schema" not in spec:
        return None
    picks = choices_of(spec["schema"])
    if picks is None:
        return None
    told = _plain_chat(body)
    if told is None:
        return None
    return told[0], told[1], picks


def _plain_chat(body: dict[str, Any]) -> tuple[str, int, int | None] | None:
    """What `text_chat` tells of a body of its keys: None where anything might be refused."""
    told = told_turns(body.get("messages"))
    if told is None:
        return None
    stop = body.get("stop")
    if stop is not None and stop.__class__ is not str and not (stop.__class__ is list and all(s.__class__ is str for s in stop)):
        return None
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (limit.__class__ is not int or limit < 1):
        return None
    temperature = body.get("temperature")
    if temperature is not None and (temperature.__class__ not in (int, float) or not 0 <= temperature <= 2):
        return None
    return *told, limit


def told_turns(messages: Any) -> tuple[str, int] | None:
    """Chat `messages` whose every turn is {role, content} of text with a role chat takes
    (which `plain._turns` reads at once, and nothing in which is refused): the last user
    turn and the input tokens. None for any other."""
    if messages.__class__ is not list or not messages:
        return None
    last_user, input_tokens = "", 0
    for m in messages:
        if m.__class__ is not dict or len(m) != 2:
            return None
        role, content = m.get("role"), m.get("content")
        if role.__class__ is not str or content.__class__ is not str or role not in CHAT_ROLES:
            return None
        if role == "user":  # (the only role read as user)
            last_user = content
        input_tokens += -(-len(content) // 4)
    return last_user, input_tokens


def answer(request: Request, last_user: str, max_tokens: int | None, seed: int | None = None,
           choices: Sequence[str] | None = None) -> str:  # fmt: skip
    choices = choices or request.choices
    if choices:
        named = _first_named(tuple(choices), last_user.lower())
        if named is not None:
            return named
        seed = zlib.crc32(request.custom_id.encode()) if seed is None else seed
        return choices[seed % len(choices)]
    return last_user if max_tokens is None else last_user[: max_tokens * 4]


def _first_named(choices: tuple[str, ...], lowered: str) -> str | None:
    """The choice found first in `lowered` (case-insensitive); of two found at one place,
    the lesser: `min` of (place, choice). None where none is found."""
    best, at_best = None, -1
    for choice, low in _lowered(choices):  # by choice: the first found at a place is the lesser
        at = lowered.find(low)
        if at >= 0 and (at_best < 0 or at < at_best):
            best, at_best = choice, at
    return best


@lru_cache(maxsize=256)
def _lowered(choices: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """A job's few choices, each with its lower case, in order (lowered once, not per answer)."""
    return tuple(sorted((c, c.lower()) for c in choices))


@dataclass(slots=True)
class Plan:
    """How echo answers one request, read and checked once (`refusal` and `outcome`)."""

    plain: Plain
    json: JsonAsk | None
    schema: Instances | None  # for `json` with a schema
    calls: list[tuple[Tool, Instances]]  # the tools a required call may go to
    picks: list[str] | None = None  # `json` is lowtide's choice schema: its choices, answered as choices


def plan(request: Request, instances: bool = True) -> Plan | Refusal:
    plain = read_plain(_without_gemini_structure(request), HONOURS)
    if isinstance(plain, Refusal):
        return plain
    if not instances:  # answer: message: the text echo, whatever the body asks
        return Plan(plain, None, None, [])
    made = _structure(request)
    if isinstance(made, Refusal):
        return made
    ask, schema, calls = made
    picks = choices_of(ask.schema) if ask is not None and not ask.bare else None
    return Plan(plain, ask, schema, list(calls) if calls else [], picks)


# What a chat body's turns stand in for in `chat_told`'s remembered plans (text turns read alike).
_STAND_IN = [{"role": "user", "content": ""}]
_CHAT_MEMO: dict[bytes, tuple[list[Any], Plan | Refusal]] = {}


def chat_told(request: Request, instances: bool = True) -> tuple[Plan | Refusal, str, int] | None:
    """A chat request whose turns are all {role, content} of text (`told_turns`), told
    without reading it whole: its plan but for the turns (a stand-in's), its last user turn
    and its input tokens. Such turns are never refused, and a job's requests differ in their
    turns alone, so the rest of the body (limits, stops, n, the JSON ask, the tools) decides
    the refusal and the rest of the plan: it is read once per distinct rest. None for any
    other request (a turn of parts, an odd role, another endpoint, a value JSON text cannot
    hold), planned the general way. Refusal and answer are the general way's, byte for byte
    (tests/routes/test_echo_chat_told.py)."""
    if request.endpoint != CHAT:
        return None
    body = request.body
    told = told_turns(body.get("messages"))
    if told is None:
        return None
    rest = {k: v for k, v in body.items() if k != "messages"}
    asked = [rest, request.choices, request.response_schema, instances]
    try:  # exact types only (orjson refuses a subclass), in the body's own key order
        key = orjson.dumps(asked, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except TypeError:
        return None
    found = _CHAT_MEMO.get(key)
    # The same text is the same rest, but for what JSON text cannot tell apart (a tuple from
    # a list, NaN from null): equality tells those.
    if found is None or found[0] != asked:
        stand_in = Request("", CHAT, rest | {"messages": _STAND_IN}, request.choices, request.response_schema)
        found = (asked, plan(stand_in, instances))
        if len(_CHAT_MEMO) >= _MEMO_SIZE:
            _CHAT_MEMO.clear()
        _CHAT_MEMO[key] = found
    return found[1], *told


def _without_gemini_structure(request: Request) -> Request:
    """A Gemini request as its plain turns read it: the generationConfig keys that ask for
    the answer's structure are read by `structure.py`, not by `read_plain`."""
    config = request.body.get("generationConfig") if request.endpoint == GEMINI else None
    if not isinstance(config, dict) or config.keys().isdisjoint(GEMINI_STRUCTURE):
        return request
    rest = {k: v for k, v in config.items() if k not in GEMINI_STRUCTURE}
    body = {k: v for k, v in request.body.items() if k != "generationConfig"} | ({"generationConfig": rest} if rest else {})
    return Request(request.custom_id, request.endpoint, body, request.choices, request.response_schema, request.attempt)


# The body keys (besides the endpoint and lowtide's response_schema) the answer's structure
# is read from: a JSON ask, the tools, the required call (Gemini: in generationConfig).
STRUCTURE_KEYS = ("response_format", "text", "output_config", "tools", "tool_choice", "generationConfig")
Structure = tuple[JsonAsk | None, Instances | None, tuple[tuple[Tool, Instances], ...]]
_NOTHING_ASKED: Structure = (None, None, ())
_MEMO: dict[bytes, tuple[list[Any], Structure | Refusal]] = {}
_MEMO_SIZE = 512


def _structure(request: Request) -> Structure | Refusal:
    """What the body asks of the answer's structure, read once per distinct ask: a job's
    requests (and a batch's lines, checked at intake and answered later) share one, and
    reading it (the tools, the schemas) costs more than the rest of a plan. Where nothing is
    asked it is told in a few lookups."""
    body = request.body
    if request.response_schema is None and body.keys().isdisjoint(STRUCTURE_KEYS):
        return _NOTHING_ASKED
    asked = [body.get(k) for k in STRUCTURE_KEYS]
    asked.append(request.response_schema)
    if asked.count(None) == len(asked):  # absent and null are the same to every reader
        return _NOTHING_ASKED
    asked.append(request.endpoint)
    try:  # exact types only (orjson refuses a subclass), in the body's own key order
        key = orjson.dumps(asked, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except TypeError:  # a value orjson does not write: read as it is, not remembered
        return _read_structure(request)
    found = _MEMO.get(key)
    # The same text is the same ask, but for what JSON text cannot tell apart (a tuple from
    # a list, NaN from null): equality tells those.
    if found is not None and found[0] == asked:
        return found[1]
    made = _read_structure(request)
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.clear()
    _MEMO[key] = (asked, made)
    return made


def _read_structure(request: Request) -> Structure | Refusal:
    ask = json_ask(request)
    if isinstance(ask, Refusal):
        return ask
    declared = tools(request)
    if isinstance(declared, Refusal):
        return declared
    for tool in declared:  # every tool's parameters must at least be a JSON Schema
        if not isinstance(tool.parameters, dict | bool):
            return Refusal(tool.field, "must be a JSON Schema (an object)")
    forced = required_call(request, declared)
    if isinstance(forced, Refusal):
        return forced
    calls = []
    for tool in forced:
        try:
            calls.append((tool, instances_for(tool.parameters)))
        except Unsatisfiable as err:
            return _unsatisfiable(tool.field, err)
    for tool in declared:
        if tool not in forced:
            try:
                instances_for(tool.parameters)
            except Unsatisfiable as err:
                if "not a valid JSON Schema" in err.reason:
                    return _unsatisfiable(tool.field, err)
    schema = None
    if ask is not None and ask.schema is not None and not calls and not ask.bare and choices_of(ask.schema) is None:
        try:
            schema = instances_for(ask.schema)
        except Unsatisfiable as err:
            return _unsatisfiable(ask.field, err)
    return ask, schema, tuple(calls)


def _unsatisfiable(field: str, err: Unsatisfiable) -> Refusal:
    where = field if err.path == "(root)" else f"{field}.{err.path}"
    return Refusal(where, f"{err.reason}; echo cannot answer it (simplify the schema, or dry-run without it)")


def replies(request: Request, p: Plan, last_user: str | None = None) -> list[Reply]:
    """One reply per choice asked (`n`); `last_user`: the request's last user turn, where
    `p`'s turns stand in for its own (`chat_told`)."""
    last_user = _last_user(p.plain) if last_user is None else last_user
    max_tokens = p.plain.max_tokens
    out = []
    for i in range(p.plain.n):
        if not p.calls and p.json is None and not request.choices:  # the text echo: no seed to draw
            full = last_user
            text = full if p.plain.max_tokens is None else full[: p.plain.max_tokens * 4]
            finish = "length" if len(text) < len(full) else "stop"  # cut at the limit
            out.append(Reply(text=text, finish=finish, output_tokens=_tokens(text)))
            continue
        seed = zlib.crc32((request.custom_id if i == 0 else f"{request.custom_id}#{i}").encode())
        if p.calls:
            tool, made = p.calls[seed % len(p.calls)]
            arguments = made.make(seed)
            out.append(Reply(finish="tool_calls", call=Call(tool.name, arguments),
                             output_tokens=_tokens(arguments_text(arguments))))  # fmt: skip
            continue
        if p.json is not None and p.json.bare:  # Gemini's text/x.enum: a bare choice
            text = answer(request, last_user, max_tokens, seed, p.json.schema["enum"])
        elif p.picks is not None:  # lowtide's own choice schema: the choice, picked as choices are
            text = choice_text(answer(request, last_user, max_tokens, seed, p.picks))
        elif p.schema is not None:
            text = arguments_text(p.schema.make(seed))
        elif p.json is not None:
            text = arguments_text({"echo": answer(request, last_user, max_tokens, seed)})
        else:  # one of the request's choices
            text = answer(request, last_user, max_tokens, seed)
        out.append(Reply(text=text, output_tokens=_tokens(text)))
    return out


@lru_cache(maxsize=256)
def choice_text(choice: str) -> str:
    """`{"choice": ...}` as `arguments_text` writes it: a job has a few choices, and a
    request answers one of them."""
    return arguments_text({CHOICE_KEY: choice})


@lru_cache(maxsize=256)
def _choice_said(choice: str) -> tuple[str, str | None, int]:
    """A choice's answer: its text (`choice_text`), that text as a JSON string (None where
    orjson refuses it, a lone surrogate: `chat_text_written` then says so), and its output tokens."""
    text = choice_text(choice)
    try:
        content = orjson.dumps(text).decode()
    except TypeError:
        content = None
    return text, content, _tokens(text)


def _fail_attempts(value: Any) -> dict[str, int]:
    """{custom_id: n}: whole numbers of attempts that fail, by custom_id."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and type(n) is int and n >= 0 for k, n in value.items()):
        raise RouteError(f"echo: route_options.fail_attempts must map custom_ids to whole numbers of attempts; got {value!r}")
    return dict(value)


class EchoRoute:
    kind: Literal["direct"] = "direct"
    name = "echo"

    def __init__(self, options: dict[str, Any]):
        unknown = set(options) - KNOWN_OPTIONS
        if unknown:
            raise RouteError(f"echo: unknown route_options {sorted(unknown)}; known: {sorted(KNOWN_OPTIONS)}")
        self.fail_attempts = _fail_attempts(options.get("fail_attempts") or {})
        self.reject = set(texts_option(self.name, options, "reject"))
        self.dispatch_size = number_option(self.name, options, "dispatch_size", 5000, int, 1)
        self.answer = options.get("answer", "instance")
        if self.answer not in ANSWERS:
            raise RouteError(f"echo: route_options.answer must be one of {', '.join(ANSWERS)}; got {self.answer!r}")

    def check_model(self, model: str) -> None:
        """echo answers for any model name: it never calls one."""

    def rest_decides(self, endpoint: str, turns: Any) -> bool:
        """Whether a body of `endpoint` with these turns is refused or not by the rest of the
        body alone: chat turns of text are never refused (`chat_told`). The loader then asks
        `refusal` once for a job's rows that differ in their turns alone."""
        return endpoint == CHAT and told_turns(turns) is not None

    def refusal(self, request: Request) -> Refusal | None:
        if request.endpoint == _echo_embed.EMBEDDINGS:
            return _echo_embed.refusal(request)
        if request.endpoint == _echo_moderate.MODERATIONS:
            return _echo_moderate.refusal(request)
        if text_chat(request) is not None:  # nothing in it to refuse
            return None
        instances = self.answer == "instance"
        if instances and choice_chat(request) is not None:  # nor in this
            return None
        told = chat_told(request, instances)
        p = plan(request, instances) if told is None else told[0]
        return p if isinstance(p, Refusal) else None

    def outcome(self, request: Request) -> Outcome:
        if request.custom_id in self.reject:
            return Outcome.failure(request.custom_id, "invalid_request", "echo: rejected by route_options.reject", False)
        if request.attempt <= self.fail_attempts.get(request.custom_id, 0):
            return Outcome.failure(request.custom_id, "server_error", f"echo: injected failure on attempt {request.attempt}", True)
        if request.endpoint == _echo_embed.EMBEDDINGS:  # vectors (routes/own/echo_embed.py)
            return _echo_embed.outcome(request)
        if request.endpoint == _echo_moderate.MODERATIONS:  # a verdict (routes/own/echo_moderate.py)
            return _echo_moderate.outcome(request, self.name)
        told = text_chat(request)
        if told is not None:
            return self._text_echo(request, *told)
        instances = self.answer == "instance"
        picked = choice_chat(request) if instances else None
        if picked is not None:
            return self._choice_echo(request, *picked)
        told = chat_told(request, instances)
        if told is not None:
            p, last_user, input_tokens = told
        else:
            p, last_user = plan(request, instances), None
        if isinstance(p, Refusal):
            return Outcome.failure(request.custom_id, "invalid_request", p.message(self.name), False)
        if last_user is None:
            input_tokens = sum(_tokens(m["content"]) for m in p.plain.messages)
        answers = replies(request, p, last_user)
        usage = Usage(input_tokens=input_tokens, output_tokens=sum(r.output_tokens for r in answers))
        first = answers[0]
        text = first.text
        if first.call is not None and first.call.name == FORCED_TOOL:  # the answer, asked through a forced tool
            text = arguments_text(first.call.arguments)
        return Outcome(request.custom_id, True, text=text, usage=usage, finish_reason=first.finish,
                       response=reply_body(request, self.name, answers, usage))  # fmt: skip

    def _text_echo(self, request: Request, full: str, input_tokens: int, limit: int | None) -> Outcome:
        """What `outcome` answers a `text_chat` request: what `replies` makes of its plan."""
        text = full if limit is None else full[: limit * 4]
        finish = "length" if len(text) < len(full) else "stop"  # cut at the limit
        return self._text_answer(request, text, finish, Usage(input_tokens=input_tokens, output_tokens=_tokens(text)))

    def _choice_echo(self, request: Request, last_user: str, input_tokens: int, picks: list[str]) -> Outcome:
        """What `outcome` answers a `choice_chat` request: what `replies` makes of its plan,
        its answer's text, JSON and tokens made once per choice (`_choice_said`)."""
        text, content, tokens = _choice_said(answer(request, last_user, None, None, picks))
        usage = Usage(input_tokens, 0, 0, tokens)
        written = chat_text_written(request, self.name, text, "stop", usage, content)
        if written is None:
            return self._text_answer(request, text, "stop", usage)
        return WrittenOutcome(request.custom_id, text, usage, "stop", written, "stop")

    def _text_answer(self, request: Request, text: str, finish: str, usage: Usage) -> Outcome:
        """A chat request's one answer of `text`, its body written as JSON text at once where
        it can be (`chat_text_written`): ingest stores that text, and no dict is made unless
        something reads `response`."""
        written = chat_text_written(request, self.name, text, finish, usage)
        if written is not None:
            return WrittenOutcome(request.custom_id, text, usage, finish, written, chat_finish(finish))
        reply = Reply(text=text, finish=finish, output_tokens=usage.output_tokens)
        return Outcome(request.custom_id, True, text=text, usage=usage, finish_reason=finish,
                       response=reply_body(request, self.name, [reply], usage))  # fmt: skip

    async def execute(self, requests: Sequence[Request]) -> AsyncIterator[Outcome]:
        for request in requests:
            yield self.outcome(request)

    async def aclose(self) -> None:
        pass


def create(options: dict[str, Any]) -> EchoRoute:
    return EchoRoute(options)
