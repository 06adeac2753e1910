"""Jinja2 templates that turn a source row into chat messages, with the content parts
(images, files) the template adds from the row's columns (`parts.py`).

StrictUndefined: a variable the row lacks is an error naming the template line and the row,
never an empty string sent to a model and paid for. Sandboxed: a template is text, and may not
reach Python internals (`''.__class__`, a global's `__globals__`) to run code or read files,
nor take more than a bounded memory and time for a row (template_sandbox.py).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.sandbox import SecurityError

from lowtide.core import conversations
from lowtide.core.endpoints import CHAT
from lowtide.core.errors import TemplateError
from lowtide.core.parts import PARTS, PartError, PartMaker
from lowtide.core.spec import JobSpec
from lowtide.core.template_sandbox import BoundedEnvironment, BoundExceeded, bounded_ast, fresh

# finalize: a null value (JSONL, Parquet) renders as "", as an empty CSV cell does, not "None".
_ENV = BoundedEnvironment(
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=False,
    finalize=lambda value: "" if value is None else value,
)


@dataclass(slots=True)
class _Part:
    role: str
    name: str  # how errors name it: "classify.yaml template.user" or a file path
    template: jinja2.Template
    variables: dict[str, int]  # variable -> first line that uses it
    constant: str | None = None  # the text, for a template that uses no variables
    # A template of plain text and `{{ name }}` only, as (text, None) and (None, name) pieces:
    # rendered by joining strings, as Jinja would, at a fraction of its cost per row.
    pieces: tuple[tuple[str | None, str | None], ...] | None = None
    source: str = ""  # the template text itself: part of what a request was rendered from
    uses_globals: bool = False  # names one of Jinja's globals (`range`, `namespace`, ...)


class MessageTemplate:
    """The system and user templates of a job, compiled once."""

    def __init__(
        self,
        parts: list[_Part],
        messages_column: str | None = None,
        body_column: str | None = None,
        media: list[PartMaker] | None = None,
        endpoint: str = CHAT,
    ):
        self.parts = parts
        self.messages_column = messages_column
        self.body_column = body_column
        self.media = media or []  # parts added to the user message, in order
        self.endpoint = endpoint
        self.text_part = PARTS.get(endpoint, PARTS[CHAT])["text"]

    @classmethod
    def from_spec(cls, spec: JobSpec, where: str = "job spec") -> MessageTemplate:
        t = spec.template
        parts = []
        for role, inline, file in (("system", t.system, t.system_file), ("user", t.user, t.user_file)):
            if file is not None:
                path = spec.resolve(file)
                try:  # -sig: a byte-order mark (Windows editors write one) is not a character of the prompt
                    source = path.read_text(encoding="utf-8-sig")
                except OSError as err:
                    raise TemplateError(f"{path}: cannot read template ({err.strerror or err}); check `template.{role}_file`") from None
                except UnicodeDecodeError as err:
                    raise TemplateError(f"{path}: byte {err.start} is not UTF-8; save the template as UTF-8 (`template.{role}_file`)") from None
                parts.append(_compile(role, str(path), source))
            elif inline is not None:
                parts.append(_compile(role, f"{where} template.{role}", inline))
        endpoint = spec.request_endpoint
        base = Path(spec.base_dir)
        media = [PartMaker("image", p.column, endpoint, base, p.detail) for p in t.images]
        media += [PartMaker("file", p.column, endpoint, base) for p in t.files]
        return cls(parts, t.messages_column, t.body_column, media, endpoint)

    @property
    def sources(self) -> list[tuple[str, str]]:
        """(role, template text) of each part, in order."""
        return [(p.role, p.source) for p in self.parts]

    @property
    def variables(self) -> dict[str, str]:
        """Every variable used, with where it is first used ("template.user line 3")."""
        found: dict[str, str] = {}
        if self.messages_column:
            found[self.messages_column] = "template.messages_column"
        if self.body_column:
            found[self.body_column] = "template.body_column"
        for maker in self.media:
            found.setdefault(maker.column, maker.where)
        for part in self.parts:
            for var, line in part.variables.items():
                found.setdefault(var, f"{part.name} line {line}")
        return found

    def check_columns(self, columns: list[str], source_name: str) -> None:
        """Refuse up front a template variable that no column provides."""
        missing = [(v, w) for v, w in self.variables.items() if v not in columns]
        if missing:
            problems = [
                f'{w} uses "{v}", but {source_name} has no such column; columns are: {", ".join(columns)}'
                for v, w in missing
            ]
            raise TemplateError.from_problems("template", problems)

    def render(self, values: dict[str, Any], row: Any = None, where: Any = None, files: list[str] | None = None) -> list[dict[str, str]]:
        """Render the messages for one row. Errors name the row: `where(row)` if given,
        else `row` itself ("tickets.csv row 7"). `files` gets the digest of each file the
        parts inline, in order (what `file_digests` gives without rendering)."""
        messages = []
        for part in self.parts:
            if part.constant is not None:  # no variables: rendered once, at compile time
                if self.media and part.role == "user":  # the row's images and files still follow it
                    messages.append({"role": "user", "content": self._with_parts(part.constant, values, row, where, files)})
                else:
                    messages.append({"role": part.role, "content": part.constant})
                continue
            try:
                if part.pieces is not None:
                    text = _join(part.pieces, values)
                else:  # shared=True: the row's dict is the context itself, not copied, and holds no globals
                    template = part.template
                    fresh()
                    text = "".join(template.root_render_func(template.new_context(values, shared=not part.uses_globals)))
            except Exception:
                err = _rewritten_error(part.template, values)
                name = where(row) if where is not None else row
                line = _error_line(err, part.name)
                if isinstance(err, jinja2.UndefinedError):
                    raise TemplateError(f"{name}: {part.name} line {line}: {err.message}; add the column or fix the template") from None
                if isinstance(err, SecurityError):
                    raise TemplateError(f"{name}: {part.name} line {line}: {_unsafe(err)}") from None
                if isinstance(err, BoundExceeded):
                    raise TemplateError(f"{name}: {part.name} line {line}: {err}") from None
                # a filter or expression that fails on this row's value
                raise TemplateError(f"{name}: {part.name} line {line}: {type(err).__name__}: {err}") from None
            if self.media and part.role == "user":
                messages.append({"role": "user", "content": self._with_parts(text, values, row, where, files)})
                continue
            messages.append({"role": part.role, "content": text})
        if self.messages_column:
            name = (lambda: where(row)) if where is not None else (lambda: row)  # named only on error
            try:
                messages.extend(conversations.check(values.get(self.messages_column), self.endpoint, self.messages_column, name))
            except ValueError as err:
                raise TemplateError(str(err)) from None
        return messages

    def _with_parts(self, text: str, values: dict[str, Any], row: Any, where: Any, files: list[str] | None) -> list[dict[str, Any]]:
        """The user message's content: its text, then a part per image or file column. An
        empty cell of an optional column adds no part."""
        content: list[dict[str, Any]] = [{"type": self.text_part, "text": text}] if text else []
        for maker in self._cells(values):
            try:
                media = maker.read(values[maker.column])
                content.append(maker.part(media))
            except PartError as err:
                name = where(row) if where is not None else row
                raise TemplateError(f"{name}: {maker.where} {err}") from None
            if files is not None and media.digest is not None:
                files.append(media.digest)
        return content

    def file_digests(self, values: dict[str, Any]) -> list[str]:
        """The digest of each file the row's parts inline, in order, read from the files alone
        (the results check a row without rendering it)."""
        return [d for maker in self._cells(values) if (d := maker.digest(values[maker.column])) is not None]

    def _cells(self, values: dict[str, Any]) -> list[PartMaker]:
        """The part makers whose cell in this row is not empty (an empty one adds no part)."""
        return [m for m in self.media if (v := values.get(m.column)) is not None and not (isinstance(v, str) and not v.strip())]


def _compile(role: str, name: str, source: str) -> _Part:
    try:
        ast = _ENV.parse(source, name=name)
        template = _ENV.from_string(bounded_ast(_ENV.parse(source, name=name), _ENV))
    except jinja2.TemplateSyntaxError as err:
        raise TemplateError(f"{name} line {err.lineno}: template syntax error: {err.message}") from None
    template.name = name
    for node in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        # There is no folder of templates to load from: say so here, not as Jinja's "no loader".
        raise TemplateError(f"{name} line {node.lineno}: a template cannot include, import or extend another one; "
                            "write that text into this template")  # fmt: skip
    declared = meta.find_undeclared_variables(ast)
    lines: dict[str, int] = {}
    for node in ast.find_all(nodes.Name):
        if node.ctx == "load" and node.name in declared:
            lines[node.name] = min(lines.get(node.name, node.lineno), node.lineno)
    constant = _render_constant(template, name) if not declared else None
    names = {node.name for node in ast.find_all(nodes.Name) if node.ctx == "load"}
    uses_globals = not names.isdisjoint(_ENV.globals)
    return _Part(role, name, template, lines, constant, _plain_pieces(ast) if declared else None, source, uses_globals)


def _unsafe(err: SecurityError) -> str:
    return f"{str(err).rstrip('.')}: a template may not reach Python internals; use the row's columns and Jinja's filters"


def _render_constant(template: jinja2.Template, name: str) -> str:
    """A template without variables is rendered once, here: its failure names the template,
    as a row's would."""
    try:
        fresh()
        return template.render()
    except Exception as err:
        line = _error_line(err, name)
        reason = _unsafe(err) if isinstance(err, SecurityError) else str(err) if isinstance(err, BoundExceeded) else f"{type(err).__name__}: {err}"
        raise TemplateError(f"{name} line {line}: {reason}") from None


def _plain_pieces(ast: nodes.Template) -> tuple[tuple[str | None, str | None], ...] | None:
    """The pieces of a template that is only text and bare variables; None for anything else
    (filters, attributes, tags...), which Jinja renders itself."""
    pieces: list[tuple[str | None, str | None]] = []
    for node in ast.body:
        if not isinstance(node, nodes.Output):
            return None
        for item in node.nodes:
            if isinstance(item, nodes.TemplateData):
                pieces.append((item.data, None))
            elif isinstance(item, nodes.Name) and item.ctx == "load":
                pieces.append((None, item.name))
            else:
                return None
    return tuple(pieces)


def _join(pieces: tuple[tuple[str | None, str | None], ...], values: dict[str, Any]) -> str:
    """What Jinja renders for plain pieces: None as "" (the environment's finalize), anything
    else as str(). A variable the row lacks raises KeyError: Jinja then names the error."""
    out = []
    for text, name in pieces:
        if name is None:
            out.append(text)
        else:
            value = values[name]
            out.append("" if value is None else value if value.__class__ is str else str(value))
    return "".join(out)


def _rewritten_error(template: jinja2.Template, values: dict[str, Any]) -> Exception:
    """The same failure through `render()`, whose traceback Jinja maps to template lines
    (the fast path above skips that; errors are rare, so they pay for it)."""
    try:
        fresh()
        template.render(values)
    except Exception as err:
        return err
    return RuntimeError("template failed once and then rendered")


def _error_line(err: Exception, name: str) -> int | str:
    """The template line that raised, from Jinja's rewritten traceback."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if frame.filename in (name, "<template>"):
            return frame.lineno or "?"
    return "?"


def template_source_path(spec: JobSpec) -> Path | None:
    return spec.resolve(spec.template.user_file) if spec.template.user_file else None
