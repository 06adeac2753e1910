"""Templates: variables with their lines, strict undefined, system + user, file templates."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.core.errors import InputError, TemplateError
from lowtide.core.spec import build_spec
from lowtide.core.templates import _ENV, MessageTemplate, template_source_path


def spec(template: dict[str, Any], base_dir: str = ".") -> Any:
    return build_spec(
        {
            "name": "t",
            "source": {"path": "t.csv", "id_column": "id"},
            "template": template,
            "model": "m",
            "route": "echo",
            "base_dir": base_dir,
        }
    )


def test_variables_with_their_first_line():
    t = MessageTemplate.from_spec(
        spec({"system": "You sort {{ kind }} tickets.", "user": "Subject: {{ subject }}\n\n{{ body }}\n{{ subject }}"}),
        where="job.yaml",
    )
    assert t.variables == {
        "kind": "job.yaml template.system line 1",
        "subject": "job.yaml template.user line 1",
        "body": "job.yaml template.user line 3",
    }


def test_loop_and_set_variables_are_not_columns():
    t = MessageTemplate.from_spec(
        spec({"user": "{% set n = 2 %}{% for tag in tags.split(',') %}{{ loop.index }}{{ tag }}{{ n }}{% endfor %}\n{{ range(3) | list }}"})
    )
    assert set(t.variables) == {"tags"}


def test_system_and_user_messages_in_order():
    t = MessageTemplate.from_spec(spec({"system": "Sort {{ kind }}.", "user": "Ticket {{ id }}: {{ body }}"}))
    assert t.render({"kind": "support", "id": "T1", "body": "hello"}, "t.csv row 1") == [
        {"role": "system", "content": "Sort support."},
        {"role": "user", "content": "Ticket T1: hello"},
    ]


def test_user_only_and_no_autoescape():
    t = MessageTemplate.from_spec(spec({"user": "{{ body }}"}))
    assert t.render({"body": "<b>&</b>"}, "r") == [{"role": "user", "content": "<b>&</b>"}]


def test_undefined_variable_is_an_error_naming_row_template_and_line():
    t = MessageTemplate.from_spec(spec({"user": "Ticket:\n\n{{ body }}"}), where="job.yaml")
    with pytest.raises(TemplateError) as info:
        t.render({"other": "x"}, "t.jsonl row 4 (line 6)")
    msg = str(info.value)
    assert msg.startswith("t.jsonl row 4 (line 6): job.yaml template.user line 3:")
    assert "'body' is undefined" in msg and "add the column or fix the template" in msg


def test_strict_undefined_also_refuses_tests_and_attributes():
    t = MessageTemplate.from_spec(spec({"user": "{% if body %}{{ body }}{% endif %}"}))
    with pytest.raises(TemplateError, match="'body' is undefined"):
        t.render({}, "r")
    t = MessageTemplate.from_spec(spec({"user": "{{ row.missing }}"}))
    with pytest.raises(TemplateError, match="has no attribute 'missing'"):
        t.render({"row": {"a": 1}}, "r")


def test_a_filter_that_fails_on_a_value_names_row_and_line():
    t = MessageTemplate.from_spec(spec({"user": "ok\n{{ n | int // zero }}"}))
    with pytest.raises(TemplateError) as info:
        t.render({"n": "4", "zero": 0}, "t.csv row 9")
    assert str(info.value).startswith("t.csv row 9: job spec template.user line 2: ZeroDivisionError")


def test_syntax_error_names_template_and_line():
    with pytest.raises(TemplateError) as info:
        MessageTemplate.from_spec(spec({"system": "fine", "user": "a\nb\n{% for x in xs %}{{ x }}"}), where="job.yaml")
    err = info.value
    assert isinstance(err, InputError)
    assert str(err).startswith("job.yaml template.user line 3: template syntax error:")


@pytest.mark.parametrize(
    "tag", ['{% include "other.j2" %}', '{% import "macros.j2" as m %}', '{% from "m.j2" import x %}', '{% extends "base.j2" %}']
)
def test_a_template_that_loads_another_is_refused_by_name(tag):
    with pytest.raises(TemplateError) as info:
        MessageTemplate.from_spec(spec({"user": "Ticket: {{ body }}\n" + tag}), where="job.yaml")
    assert str(info.value) == (
        "job.yaml template.user line 2: a template cannot include, import or extend another one; write that text into this template"
    )


def test_check_columns_lists_every_missing_variable():
    t = MessageTemplate.from_spec(spec({"system": "{{ kind }}", "user": "{{ body }}\n{{ subjet }}"}))
    t.check_columns(["kind", "body", "subjet"], "t.csv")
    with pytest.raises(TemplateError) as info:
        t.check_columns(["id", "body"], "t.csv")
    err = info.value
    assert len(err.problems) == 2
    assert 'template.system line 1 uses "kind", but t.csv has no such column; columns are: id, body' in str(err)
    assert 'template.user line 2 uses "subjet", but t.csv has no such column' in str(err)


def test_file_templates_resolve_against_base_dir(tmp_path):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "user.j2").write_text("Ticket {{ id }}\n\n{{ body }}\n", encoding="utf-8")
    (tmp_path / "prompts" / "system.j2").write_text("You are {{ role }}.", encoding="utf-8")
    s = spec({"system_file": "prompts/system.j2", "user_file": "prompts/user.j2"}, base_dir=str(tmp_path))
    t = MessageTemplate.from_spec(s)
    assert template_source_path(s) == tmp_path / "prompts" / "user.j2"
    user_path = str(tmp_path / "prompts" / "user.j2")
    assert t.variables["body"] == f"{user_path} line 3"
    assert t.variables["role"] == f"{tmp_path / 'prompts' / 'system.j2'} line 1"
    messages = t.render({"id": "T1", "body": "hi", "role": "a sorter"}, "r")
    assert messages == [
        {"role": "system", "content": "You are a sorter."},
        {"role": "user", "content": "Ticket T1\n\nhi"},  # the file's last newline is dropped
    ]
    with pytest.raises(TemplateError) as info:
        t.render({"id": "T1", "role": "x"}, "r")
    assert str(info.value).startswith(f"r: {user_path} line 3: 'body' is undefined")


def test_a_template_file_saved_with_a_byte_order_mark_renders_without_it(tmp_path):
    """Windows editors start a UTF-8 file with a byte-order mark: it reached the model as the
    first character of every prompt (U+FEFF)."""
    (tmp_path / "user.j2").write_bytes("\ufeffTicket: {{ body }}".encode())
    (tmp_path / "latin.j2").write_bytes("Caf\xe9 {{ body }}".encode("latin-1"))
    t = MessageTemplate.from_spec(spec({"user_file": "user.j2"}, base_dir=str(tmp_path)))
    assert t.render({"body": "hello"}, "r") == [{"role": "user", "content": "Ticket: hello"}]
    with pytest.raises(TemplateError, match=r"latin.j2: byte 3 is not UTF-8; save the template as UTF-8 \(`template.user_file`\)"):
        MessageTemplate.from_spec(spec({"user_file": "latin.j2"}, base_dir=str(tmp_path)))


def test_missing_template_file_names_the_path_and_key(tmp_path):
    s = spec({"user_file": "nope.j2"}, base_dir=str(tmp_path))
    with pytest.raises(TemplateError) as info:
        MessageTemplate.from_spec(s)
    msg = str(info.value)
    assert str(tmp_path / "nope.j2") in msg and "cannot read template" in msg and "template.user_file" in msg
    assert template_source_path(spec({"user": "x"})) is None


def test_inline_template_with_system_file(tmp_path):
    (tmp_path / "sys.j2").write_text("S {{ a }}", encoding="utf-8")
    t = MessageTemplate.from_spec(spec({"system_file": "sys.j2", "user": "U {{ b }}"}, base_dir=str(tmp_path)))
    assert [m["content"] for m in t.render({"a": 1, "b": 2}, "r")] == ["S 1", "U 2"]


VALUES = st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.lists(st.integers(), max_size=3)
NAMES = st.sampled_from(["a", "b", "body"])
PIECES = st.lists(st.tuples(st.text(alphabet="xy \n{}%#-", max_size=5), NAMES), min_size=1, max_size=4)


@given(PIECES, st.dictionaries(NAMES, VALUES, min_size=3, max_size=3), st.text(alphabet="xy \n", max_size=3))
def test_a_plain_template_renders_exactly_as_jinja_renders_it(pieces, values, tail):
    # Plain text and bare variables skip Jinja's machinery; the text must not change.
    source = "".join(f"{text.replace('{', '(').replace('}', ')').replace('%', 'p').replace('#', 'h')}{{{{ {name} }}}}" for text, name in pieces) + tail
    template = MessageTemplate.from_spec(spec({"user": source}))
    assert template.parts[0].pieces is not None
    assert template.render(values)[0]["content"] == _ENV.from_string(source).render(values)


def test_a_template_with_more_than_variables_is_left_to_jinja():
    template = MessageTemplate.from_spec(spec({"user": "{{ body|upper }} {% if a %}x{% endif %}"}))
    assert template.parts[0].pieces is None
    assert template.render({"body": "hi", "a": 1})[0]["content"] == "HI x"


def test_a_plain_template_still_names_a_missing_variable():
    template = MessageTemplate.from_spec(spec({"user": "one\n{{ body }}"}))
    with pytest.raises(TemplateError, match=r"row 3: .*template.user line 2: 'body' is undefined"):
        template.render({}, "tickets.csv row 3")


@pytest.mark.parametrize(
    "user",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # no variables: rendered once, when compiled
        "{{ body.__class__.__mro__[1].__subclasses__() }}",
        "{{ body }}{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ body }}{{ lipsum.__globals__['__builtins__'].open(path).read() }}",
        "{{ body }}{{ (body | attr('__class__')).__base__ }}",
    ],
)
def test_a_template_cannot_reach_python_internals(tmp_path, user):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    with pytest.raises(TemplateError, match="is unsafe: a template may not reach Python internals") as info:
        t = MessageTemplate.from_spec(spec({"user": user}), where="job.yaml")
        t.render({"body": "hi", "path": str(secret)}, "t.csv row 1")
    assert "template.user line 1" in str(info.value) and "s3cr3t" not in str(info.value)


def test_jinja_globals_render_on_every_row():
    # range and namespace are Jinja's own globals, not columns: the row's context must have them
    t = MessageTemplate.from_spec(spec({"user": "{% set ns = namespace(n=0) %}{% for i in range(2) %}{{ body }}{% set ns.n = i %}{% endfor %}{{ ns.n }}"}))
    assert t.render({"body": "hi"}, "r") == [{"role": "user", "content": "hihi1"}]


def test_a_template_without_variables_that_fails_names_the_template_and_line():
    with pytest.raises(TemplateError) as info:
        MessageTemplate.from_spec(spec({"system": "fine", "user": "a\n{{ 1 // 0 }}"}), where="job.yaml")
    assert str(info.value) == "job.yaml template.user line 2: ZeroDivisionError: integer division or modulo by zero"


# Bounds (issue 34): `('a' * 400000000)|length` ran, RSS 506 MB. Each of these is refused
# before it allocates, naming the template field, its line and the bound; resource.getrusage
# shows the peak stayed near where it was.
BOMBS = [
    ("{{ body }}{{ ('a' * 400000000)|length }}", "str * 400,000,000 would be 400,000,000 characters"),
    ("{{ ('a' * 400000000)|length }}", "str * 400,000,000"),  # no variables: rendered once, when compiled
    ("{{ body * 400000000 }}", "str * 400,000,000"),
    ("{{ body }}{{ [1] * 400000000 }}", "list * 400,000,000"),
    ("{{ body }}{{ 2 ** 400000000 }}", "a number of 400,000,000 bits"),
    ("{{ body }}{{ '%0400000000d' % 1 }}", "a format width or precision of 8 digits or more"),
    ("{{ body }}{{ '{:>400000000}'.format(1) }}", "a format width or precision of 8 digits or more"),
    ("{{ body }}{{ '%0400000000d'|format(1) }}", "a format width or precision of 8 digits or more"),
    ("{{ body.ljust(400000000) }}", "str.ljust(400000000) would be 400,000,000 characters"),
    ("{{ body|center(400000000) }}", "center(400000000)"),
    ("{{ body|indent(400000000) }}", "indent(400000000)"),
    ("{{ body }}{{ [1]|batch(400000000, 'x')|list|length }}", "batch would have 400,000,000 items"),
    ("{{ body }}{{ range(100000)|join(body * 1000) }}", "join would be"),
    ("{{ (body * 5000).replace('h', body * 5000) }}", "str.replace would be"),
    ("{% set ns = namespace(s=body) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", "joined with ~"),
    ("{{ body }}{% for i in range(100000) %}{{ body * 1000 }}{% endfor %}", "wrote more than 16,777,216 characters"),
    ("{{ body }}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "more than 1,000,000 steps"),
    ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ body }}{{ f(40) }}", "more than 1,000,000 steps"),
    ("{{ body }}{{ lipsum(10000000) }}", "lipsum(10000000"),
]


@pytest.mark.parametrize(("user", "said"), BOMBS)
def test_a_template_that_would_take_the_machine_is_refused_naming_the_bound(user, said):
    import resource  # noqa: PLC0415

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TemplateError) as info:
        t = MessageTemplate.from_spec(spec({"user": user}), where="job.yaml")
        t.render({"body": "hi"}, "t.csv row 1")
    message = str(info.value)
    assert "job.yaml template.user line 1" in message and said in message, message
    assert "a template may" in message  # the bound itself is named
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: never the 400 MB asked for


def test_templates_within_the_bounds_render_as_before():
    user = ("{% for m in msgs %}{{ loop.index }}. {{ m|upper|center(9) }} {{ m ~ '!' }}{% endfor %}|{{ '%5d' % n }}|"
            "{{ '{:>4}'.format(n) }}|{{ msgs|join(',') }}|{{ body * 3 }}|{{ 2 ** 10 }}|{{ body.ljust(4, '.') }}|"
            "{{ (body ~ ' there')|replace('there', 'you') }}|{{ [0] * 2 }}")  # fmt: skip
    t = MessageTemplate.from_spec(spec({"user": user}))
    (message,) = t.render({"msgs": ["a", "b"], "n": 7, "body": "hi"}, "r")
    assert message["content"] == ("1.     A     a!2.     B     b!|    7|   7|a,b|hihihi|1024|hi..|hi you|[0, 0]")
    big = "x" * 8_000_000  # a long document is no bomb: written once, within MAX_TEXT
    (message,) = MessageTemplate.from_spec(spec({"user": "Summarise:\n{{ doc|trim }}"})).render({"doc": big}, "r")
    assert len(message["content"]) == len(big) + 11
