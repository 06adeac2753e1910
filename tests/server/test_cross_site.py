"""Other sites (server/guard.py): with no key configured, serve answers only to loopback names
and the `--allow-host` ones (DNS rebinding), refuses a foreign `Origin` (403) and a body of
another type than JSON on a JSON endpoint (415). The browser tests drive headless Chromium
from a page of another origin, and from one whose name was made to point at serve."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as gt

from lowtide.server import ServeConfig, create_app, guard
from tests.server.browser import WAIT_MS, _missing
from tests.server.conftest import FAST, Running, chat_line, message_request, on_loopback, upload

CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
MESSAGE_BATCH = {"requests": [message_request("a")]}


@contextmanager
def guarded(tmp_path: Path, **config: Any) -> Iterator[Running]:
    """serve as `lowtide serve` runs it: the app and its guard, on a loopback port."""
    config = {"time_scale": FAST, "data_dir": tmp_path / "data", "db": str(tmp_path / "lowtide.db"), **config}
    app = create_app(ServeConfig(**config))
    guard.protect(app, app.state.server.config)
    with on_loopback(app) as port:
        yield Running(port, app)


def _created(s: Running) -> dict[str, int]:
    """What the server holds: files, OpenAI batches, message batches."""
    client = s.openai()
    return {"files": len(client.files.list().data), "batches": len(client.batches.list().data),
            "message_batches": len(s.anthropic().messages.batches.list().data)}  # fmt: skip


NOTHING = {"files": 0, "batches": 0, "message_batches": 0}


# Host ----------------------------------------------------------------------------------
def test_with_no_key_a_name_not_loopback_is_refused_naming_allow_host(tmp_path):
    with guarded(tmp_path) as s:
        answer = httpx.post(f"{s.url}/v1/messages/batches", json=MESSAGE_BATCH, headers={"host": f"rebind.example:{s.port}"})
        assert answer.status_code == 400
        assert answer.json()["type"] == "error"  # Anthropic's shape on Anthropic's path
        message = answer.json()["error"]["message"]
        assert "rebind.example" in message and "--allow-host rebind.example" in message
        refused = httpx.get(f"{s.url}/v1/batches", headers={"host": "rebind.example"})
        assert refused.status_code == 400 and "--allow-host" in refused.json()["error"]["message"]
        for host in ("localhost", f"localhost:{s.port}", f"127.0.0.1:{s.port}", "[::1]:8000", "10.1.2.3:8000", "LOCALHOST."):
            assert httpx.get(f"{s.url}/v1/batches", headers={"host": host}).status_code == 200, host
        assert _created(s) == NOTHING


def test_allow_host_serves_that_name_and_keys_serve_any(tmp_path):
    with guarded(tmp_path, allow_hosts=("llm.lan",)) as s:
        assert httpx.get(f"{s.url}/v1/batches", headers={"host": f"LLM.lan:{s.port}"}).status_code == 200
        assert httpx.get(f"{s.url}/v1/batches", headers={"host": "other.lan"}).status_code == 400
    with guarded(tmp_path, allow_hosts=("*",)) as s:
        assert httpx.get(f"{s.url}/v1/batches", headers={"host": "any.example"}).status_code == 200
    with guarded(tmp_path, api_keys=("k1",)) as s:  # a rebinding page holds no key
        assert httpx.get(f"{s.url}/v1/batches", headers={"host": "any.example", "authorization": "Bearer k1"}).status_code == 200


# Origin --------------------------------------------------------------------------------
def test_a_foreign_origin_is_refused_naming_it_and_allow_origin(tmp_path):
    with guarded(tmp_path) as s:
        answer = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"})
        assert answer.status_code == 403
        message = answer.json()["error"]["message"]
        assert "https://evil.example" in message and "--allow-origin https://evil.example" in message
        for origin in ("null", f"http://localhost:{s.port}", "http://127.0.0.1", "file://"):
            assert httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, headers={"origin": origin}).status_code == 403, origin
        same = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, headers={"origin": s.url})
        assert same.status_code == 200  # the server's own pages (the dashboard)
    with guarded(tmp_path, allow_origins=("https://app.example.com",), api_keys=("k1",)) as s:
        fine = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, headers={"origin": "https://APP.example.com", "x-api-key": "k1"})
        assert fine.status_code == 200
        other = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example", "x-api-key": "k1"})
        assert other.status_code == 403  # with keys too


# Content type --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_a_json_endpoint_refuses_another_content_type_naming_json(tmp_path, kind):
    with guarded(tmp_path) as s:
        answer = httpx.post(f"{s.url}/v1/messages/batches", content=json.dumps(MESSAGE_BATCH), headers={"content-type": kind})
        assert answer.status_code == 415
        assert "application/json" in answer.json()["error"]["message"]
        file = upload(s.openai(), [chat_line("a")])
        create = {"input_file_id": file.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        refused = httpx.post(f"{s.url}/v1/batches", content=json.dumps(create), headers={"content-type": kind})
        assert refused.status_code == 415 and refused.json()["error"]["type"] == "invalid_request_error"
        assert httpx.post(f"{s.url}/v1/chat/completions", content=json.dumps(CHAT), headers={"content-type": kind}).status_code == 415
        assert _created(s) == NOTHING | {"files": 1}


def test_json_in_any_of_its_spellings_and_a_body_without_type_are_read(tmp_path):
    with guarded(tmp_path) as s:
        for kind in ("application/json", "Application/JSON; charset=utf-8", "application/vnd.api+json", None):
            headers = {"content-type": kind} if kind else {}
            answer = httpx.post(f"{s.url}/v1/chat/completions", content=json.dumps(CHAT).encode(), headers=headers)
            assert answer.status_code == 200, (kind, answer.text)


# The SDKs at their defaults -------------------------------------------------------------
def test_each_sdk_at_its_defaults_is_served(tmp_path):
    """Every call that sends a body, as each official SDK sends it: none refused."""
    with guarded(tmp_path, complete_after=360_000) as s:  # batches stay in progress: cancellable
        oa = openai.OpenAI(base_url=f"{s.url}/v1", api_key="any")
        file = oa.files.create(file=("in.jsonl", (json.dumps(chat_line("a")) + "\n").encode()), purpose="batch")
        batch = oa.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        oa.batches.cancel(batch.id)
        oa.chat.completions.create(**CHAT)
        oa.files.delete(file.id)
        an = anthropic.Anthropic(base_url=s.url, api_key="any")
        messages = an.messages.batches.create(requests=[message_request("a")])
        an.messages.batches.cancel(messages.id)
        an.messages.create(model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        gm = genai.Client(api_key="any", http_options=gt.HttpOptions(base_url=s.url))
        line = {"key": "a", "request": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}}
        uploaded = gm.files.upload(file=io.BytesIO(json.dumps(line).encode()), config={"mime_type": "jsonl"})
        job = gm.batches.create(model="gemini-2.5-flash", src=uploaded.name)
        gm.batches.cancel(name=job.name)
        gm.batches.create(model="gemini-2.5-flash", src=[{"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}])
        gm.files.delete(name=uploaded.name)
        gm.models.generate_content(model="gemini-2.5-flash", contents="hi")


# In a browser --------------------------------------------------------------------------
ATTACKER = "http://attacker.example"
REBOUND = "rebind.example"
# The attacks a page can make without asking first: simple requests (text/plain, form and
# multipart bodies) that the browser sends, though it will not show the page the answer.
ATTACKS = """async (base) => {
  const sent = [];
  const post = async (path, body, type) => {
    const init = {method: "POST", mode: "no-cors", body};
    if (type) init.headers = {"content-type": type};
    try { await fetch(base + path, init); sent.push(path); } catch (e) { sent.push(path + ": " + e); }
  };
  await post("/v1/messages/batches", JSON.stringify(BATCH), "text/plain");
  await post("/v1/chat/completions", JSON.stringify(CHAT), "text/plain");
  const form = new FormData();
  form.append("purpose", "batch");
  form.append("file", new Blob([JSON.stringify(LINE) + "\\n"]), "in.jsonl");
  await post("/v1/files", form);
  await post("/v1/messages/batches", new Blob([JSON.stringify(BATCH)]));
  return sent;
}"""
for name, value in (("BATCH", MESSAGE_BATCH), ("CHAT", CHAT), ("LINE", chat_line("a"))):
    ATTACKS = ATTACKS.replace(name, json.dumps(value))


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Chromium that resolves rebind.example to 127.0.0.1, as a rebinding DNS server would."""
    path = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: pip install -e '.[test]'")
    if path is None:
        _missing("no `chromium` on PATH: apt-get install chromium")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, args=["--no-sandbox", f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1", "--disable-features=LocalNetworkAccessChecks"])
        yield launched
        launched.close()


def _tab(chromium, page_url: str) -> tuple[Any, Any, dict[str, int]]:
    """A tab on `page_url`, a page served by the test (the attacker's); the statuses of what
    it sends elsewhere, by path, as the browser saw them."""
    context = chromium.new_context()
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    tab.route(page_url, lambda route: route.fulfill(status=200, content_type="text/html", body="<html><body>hello</body></html>"))
    statuses: dict[str, int] = {}
    tab.on("response", lambda r: statuses.__setitem__(httpx.URL(r.url).path, r.status) if r.url != page_url else None)
    tab.goto(page_url)
    return context, tab, statuses


def test_a_page_of_another_origin_creates_nothing(tmp_path, chromium):
    with guarded(tmp_path) as s:
        context, tab, statuses = _tab(chromium, f"{ATTACKER}/page.html")
        try:
            sent = tab.evaluate(ATTACKS, s.url)
            assert sent == ["/v1/messages/batches", "/v1/chat/completions", "/v1/files", "/v1/messages/batches"]
            tab.evaluate("1")  # a round trip: the responses' events, sent before its answer, are in
            assert statuses == {"/v1/messages/batches": 403, "/v1/chat/completions": 403, "/v1/files": 403}
            # A form posted across sites, the classic way (text/plain, a navigation).
            tab.set_content(f"""<form id=f method=post enctype=text/plain action="{s.url}/v1/batches">
                                <input name='{{"input_file_id":"file-x","endpoint":"/v1/chat/completions","x":"' value='"}}'></form>""")
            with tab.expect_navigation() as navigation:
                tab.eval_on_selector("#f", "f => f.submit()")
            assert navigation.value.status == 403 and "--allow-origin" in tab.content()
        finally:
            context.close()
        assert _created(s) == NOTHING


def test_a_page_rebound_to_serves_address_reads_and_creates_nothing(tmp_path, chromium):
    with guarded(tmp_path) as s:
        s.openai().files.create(file=("secret.jsonl", b'{"custom_id": "a"}\n'), purpose="batch")
        page_url = f"http://{REBOUND}:{s.port}/page.html"
        context, tab, _ = _tab(chromium, page_url)
        try:
            # Same origin now: the page may read what it gets, and send JSON as it likes.
            read = tab.evaluate("""async () => {
                const listed = await fetch("/v1/files");
                const made = await fetch("/v1/messages/batches", {method: "POST", headers: {"content-type": "application/json"},
                                                                  body: JSON.stringify(BATCH)});
                return [listed.status, await listed.text(), made.status];
            }""".replace("BATCH", json.dumps(MESSAGE_BATCH)))
        finally:
            context.close()
        status, text, made = read
        assert (status, made) == (400, 400)
        assert "secret.jsonl" not in text and "--allow-host" in text
        assert _created(s) == NOTHING | {"files": 1}
