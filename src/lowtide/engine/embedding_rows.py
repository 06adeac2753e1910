"""An embedding or moderation job's row text, the body's `input`: refused when empty; an
embedding's also when over the model's token limit, or cut to the limit when the spec says
`truncate: true` (docs/embeddings.md "Bad input")."""

from __future__ import annotations

from collections.abc import Callable

from lowtide.core.embeddings import MAX_INPUT_TOKENS, model_facts
from lowtide.core.errors import LowtideError
from lowtide.core.spec import JobSpec
from lowtide.core.tokens import TokenCounter, counter_for
from lowtide.routes import create_route


class EmbeddingInput:
    def __init__(self, spec: JobSpec):
        self.model = spec.model
        facts = model_facts(spec.model)
        self.limit = facts.max_input_tokens if facts else MAX_INPUT_TOKENS
        self.truncate = spec.truncate
        self.counter: TokenCounter = _route_counter(spec) or counter_for(spec.model, None)
        # A token is at least one UTF-8 byte and a character at most four: text of up to
        # limit / 4 characters cannot be over the limit and is not counted.
        self.safe_chars = self.limit // 4

    def text(self, messages: list[dict], where: Callable[[], str]) -> tuple[str, str | None]:
        """The text to embed from the rendered template, and the problem with it (or None)."""
        text = "\n\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
        if not text.strip():
            return text, (
                f'{where()}: field "input" (template.user) is empty or only whitespace; an embedding needs text. '
                "Fill in the row's text, or leave the row out of the source"
            )
        if len(text) <= self.safe_chars:
            return text, None
        tokens = self.counter.count_text(text)
        if tokens <= self.limit:
            return text, None
        if self.truncate:
            return self.cut(text), None
        how = "" if self.counter.exact else " (approximated: characters / 4, more outside ASCII)"
        return text, (
            f'{where()}: field "input" is {tokens} tokens{how}; {self.model} takes at most {self.limit} per input. '
            f"Shorten the text, or set `truncate: true` in the spec to cut it to {self.limit} tokens"
        )

    def cut(self, text: str) -> str:
        """The longest prefix of `text` within the limit (a binary search over its length)."""
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.counter.count_text(text[:mid]) <= self.limit:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo]


def _route_counter(spec: JobSpec) -> TokenCounter | None:
    """The route's own count for its model, where it has the model's tokenizer (`local`'s
    embedding model): then the limit and `truncate` are exact."""
    try:
        route = create_route(spec.route, spec.route_options)
    except LowtideError:  # a missing key, say: the spec's check says so
        return None
    counter = getattr(route, "token_counter", None)
    return counter(spec.model) if counter is not None else None


class ModerationInput:
    """A moderation job's row text: the rendered template, refused when empty (a
    classification of nothing says nothing). The provider judges its length."""

    def text(self, messages: list[dict], where: Callable[[], str]) -> tuple[str, str | None]:
        text = "\n\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
        if not text.strip():
            return text, (
                f'{where()}: field "input" (template.user) is empty or only whitespace; a moderation needs text. '
                "Fill in the row's text, or leave the row out of the source"
            )
        return text, None
