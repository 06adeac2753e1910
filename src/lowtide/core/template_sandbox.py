"""The environment templates run in: Jinja's ImmutableSandboxedEnvironment (no Python
internals, no changing the row's values) with a bound on what one render may cost, so that
a template cannot take the machine's memory or time (`('a' * 400000000)|length` took
506 MB; a loop nested in a loop could run for ever). Per render:

- MAX_TEXT characters written (every `{{ }}`, and the literal text of each loop turn), and
  no text or list made larger than that: `*`, `+`, `~`, `%`, `**`, padding (`center`,
  `indent`, `ljust`, format widths), `join` and `replace` are checked before they run;
- MAX_STEPS steps: a loop turn, a call (a method, a global) or a filter is one, a macro
  call MACRO_STEPS (about 15 µs against 1.5 µs);

Past a bound the render raises `BoundExceeded` naming it; templates.py names the template
and the row. `fresh()` starts a render's count (per thread: rows render in parallel).

    env = BoundedEnvironment(undefined=StrictUndefined, autoescape=False)
    template = env.from_string(bounded_ast(env.parse(source)))
    fresh(); text = template.render(values)
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.runtime import Context, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_TEXT = 16 * 1024 * 1024  # characters: more than any model's context window takes
MAX_ITEMS = 1_000_000  # items of a list a template makes
MAX_STEPS = 1_000_000  # loop turns, calls and filters: about a second of Python
MACRO_STEPS = 10
MAX_POWER_BITS = 4096
STEPS_FILTER, CONCAT_FILTER = "_lowtide_steps", "_lowtide_concat"
# A format width or precision (`%0400000000d`, `{:>400000000}`) of 8 digits or more.
_WIDE_FORMAT = re.compile(r"%[-#0 +]*\d{8,}|%[-#0 +]*\d*\.\d{8,}|\{[^{}]*:[^{}]*?\d{8,}")
_PADDING_METHODS = {"center", "ljust", "rjust", "zfill"}


class BoundExceeded(Exception):
    """A render went past one of the bounds; the message names it."""


class _Left(threading.local):
    steps = MAX_STEPS
    text = MAX_TEXT


_LEFT = _Left()


def fresh() -> None:
    """Start counting one render."""
    _LEFT.steps, _LEFT.text = MAX_STEPS, MAX_TEXT


def _step(n: int = 1) -> None:
    _LEFT.steps -= n
    if _LEFT.steps < 0:
        raise BoundExceeded(f"the template took more than {MAX_STEPS:,} steps (loop turns, calls and filters) for one row; "
                            f"a template may take at most {MAX_STEPS:,}")  # fmt: skip


def _wrote(n: int) -> None:
    _LEFT.text -= n
    if _LEFT.text < 0:
        raise BoundExceeded(f"the template wrote more than {MAX_TEXT:,} characters for one row; a template may write at most {MAX_TEXT:,}")


def _size_ok(size: float, what: str) -> None:
    if size > MAX_TEXT:
        raise BoundExceeded(f"{what} would be {size:,.0f} characters or items; a template may make at most {MAX_TEXT:,}")


def _items_ok(count: float, what: str) -> None:
    if count > MAX_ITEMS:
        raise BoundExceeded(f"{what} would have {count:,.0f} items; a template may make lists of at most {MAX_ITEMS:,}")


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple | bytes) else 0


def _format_ok(fmt: Any) -> None:
    if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
        raise BoundExceeded(f"a format width or precision of 8 digits or more ({_WIDE_FORMAT.search(fmt).group()!r}); "
                            f"a template may make text of at most {MAX_TEXT:,} characters")  # fmt: skip


def _join_size(items: list[Any], sep: Any) -> int:
    return sum(len(x) if isinstance(x, str) else len(str(x)) for x in items) + len(str(sep)) * max(len(items) - 1, 0)


def _replace_size(text: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    times = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    return len(text) + times * (len(new) - len(old))


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "+", "%", "**"})  # also kept from compile-time folding

    def __init__(self, **options: Any):
        finalize = options.pop("finalize", None) or (lambda value: value)

        def counted(value: Any) -> Any:  # every `{{ }}` is written through this
            value = finalize(value)
            _wrote(len(value) if isinstance(value, str) else len(str(value)))
            return value

        super().__init__(finalize=counted, **options)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters[STEPS_FILTER] = _steps
        self.filters[CONCAT_FILTER] = _concat
        self.globals["lipsum"] = _bounded_lipsum(self.globals["lipsum"])

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _step()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    _size_ok(len(seq) * times, f"{type(seq).__name__} * {times:,}")
        elif operator == "+":
            _size_ok(_sized(left) + _sized(right), "the sum")
        elif operator == "%":
            _format_ok(left)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            bits = right * math.log2(abs(left)) if abs(left) > 1 else 1
            if bits > MAX_POWER_BITS:
                raise BoundExceeded(f"{left} ** {right} would be a number of {bits:,.0f} bits; a template may make at most {MAX_POWER_BITS:,}")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's names)
        _step(MACRO_STEPS if isinstance(__obj, Macro) else 1)
        method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
        owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
        if isinstance(owner, str):
            if name in _PADDING_METHODS and args:
                _size_ok(_int(args[0]), f"str.{name}({args[0]})")
            elif name == "expandtabs":
                _size_ok(len(owner) * max(_int(args[0]) if args else 8, 1), "str.expandtabs")
            elif name in ("format", "format_map"):
                _format_ok(owner)
            elif name == "replace" and len(args) >= 2:
                _size_ok(_replace_size(owner, *args[:3]), "str.replace")
            elif name == "join" and args:
                items = list(args[0])
                _size_ok(_join_size(items, owner), "str.join")
                args = (items, *args[1:])
        result = super().call(__context, __obj, *args, **kwargs)
        _size_ok(_sized(result), f"the result of {name or 'a call'}")
        return result


# Filters -----------------------------------------------------------------------------------
def _check_filter(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Refuse, before it runs, a filter call whose result would pass the bounds; the args
    to call it with (an iterable given to `join` is read once, here)."""

    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    value = args[0] if args else None
    if name == "center":
        _size_ok(_int(arg(1, "width", 80)), f"center({arg(1, 'width')})")
    elif name == "indent":
        width = arg(1, "width", 4)
        pad = width if isinstance(width, int) else len(str(width))
        _size_ok(_sized(value) + pad * (str(value).count("\n") + 1), f"indent({width!r})")
    elif name == "wordwrap":
        lines = _sized(value) / max(_int(arg(1, "width", 79)), 1) + 1
        _size_ok(_sized(value) + lines * len(str(arg(4, "wrapstring", "") or "\n")), "wordwrap")
    elif name in ("batch", "slice"):
        _items_ok(_int(arg(1, "linecount" if name == "batch" else "slices", 0)), name)
    elif name == "format":
        _format_ok(value)
    elif name == "replace":
        _size_ok(_replace_size(value, arg(1, "old"), arg(2, "new"), arg(3, "count", -1)), "replace")
    elif name == "join" and args and not isinstance(value, str | list | tuple):
        args = (list(value), *args[1:])
    if name == "join" and args and isinstance(args[0], list | tuple):
        _size_ok(_join_size(list(args[0]), arg(1, "d", "")), "join")
    elif name == "list" and isinstance(value, str):
        _items_ok(len(value), "list")
    return args


def _bounded_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    # A filter may take the context, eval context or environment first (jinja_pass_arg,
    # kept by wraps): the value and the arguments checked are after it.
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _step()
        args = (*args[:skip], *_check_filter(name, args[skip:], kwargs))
        result = f(*args, **kwargs)
        _size_ok(_sized(result), f"the result of |{name}")
        return result

    return bounded


def _bounded_lipsum(lipsum: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(lipsum)
    def bounded(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 (Jinja's names)
        _size_ok(_int(n) * _int(max) * 12, f"lipsum({n}, max={max})")  # words of up to 12 characters
        return lipsum(n, html, min, max)

    return bounded


@pass_context  # never folded at compile time: counted on every render
def _steps(context: Context, iterable: Any, literal: int = 0) -> Any:
    """A loop's items, each a step, each writing its body's `literal` characters."""
    for item in iterable:
        _step()
        _wrote(literal)
        yield item


@pass_context
def _concat(context: Context, pieces: list[Any]) -> str:
    """`a ~ b`: as Jinja joins it (str of each), refused before it passes MAX_TEXT."""
    texts = [p if isinstance(p, str) else str(p) for p in pieces]
    _size_ok(sum(map(len, texts)), "the text joined with ~")
    return "".join(texts)


class _Bounder(NodeTransformer):
    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        literal = sum(len(d.data) for part in node.body for d in part.find_all(nodes.TemplateData))
        node.iter = nodes.Filter(node.iter, STEPS_FILTER, [nodes.Const(literal)], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), CONCAT_FILTER, [], [], None, None, lineno=node.lineno)


def bounded_ast(ast: nodes.Template, env: BoundedEnvironment) -> nodes.Template:
    """The template with each loop counted and each `~` checked (to compile with `env`)."""
    ast = _Bounder().visit(ast)
    ast.set_environment(env)
    return ast
