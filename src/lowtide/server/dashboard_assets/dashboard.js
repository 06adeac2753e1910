// The lowtide dashboard: polls /dashboard/api/... and draws what it gets. Amounts arrive as
// decimal strings (cost_report's own) and are shown with 2-6 decimals; the exact string is
// kept in each figure's data-value (and title). An unknown cost is shown as "unknown".
// "failed" is always failed requests; failed attempts (tries) are labelled as such.
"use strict";

const REFRESH_MS = Number(document.body.dataset.refresh) || 2000;
const SVG = "http://www.w3.org/2000/svg";
const PAGE = 50;  // failed rows per page
const ANSWERS = 20;  // answers per page
// Request states in the order a bar draws them, with their legend words.
const STATES = [["succeeded", "succeeded"], ["failed", "failed"], ["cancelled", "cancelled"], ["in_flight", "in flight"], ["waiting", "waiting"]];
let selected = decodeURIComponent(location.hash.slice(1)) || null;
let timer = null;
const failedView = { reason: "", q: "", offset: 0 };  // the failed rows' filter and page
const answersView = { q: "", offset: 0 };  // the answers' filter and page
// Once a job is chosen (a tap, or #JOB in the address), its page is scrolled into view when
// drawn: it comes below the list, off a phone's screen.
let reveal = Boolean(selected);

// Formatting ------------------------------------------------------------------------------
function plain(s) {
  // "1E-9" -> "0.000000001" (Python's Decimal writes tiny amounts with an exponent)
  const m = /^(-?)(\d+)(?:\.(\d+))?[eE]([+-]?\d+)$/.exec(s);
  if (!m) return s;
  const digits = m[2] + (m[3] || ""), exp = Number(m[4]) - (m[3] || "").length;
  if (exp >= 0) return m[1] + digits + "0".repeat(exp);
  const padded = digits.padStart(-exp + 1, "0");
  return m[1] + padded.slice(0, exp) + "." + padded.slice(exp);
}

function usd(s) {
  if (s === null || s === undefined) return "unknown";
  let text = plain(String(s)), sign = "";
  if (text.startsWith("-")) { sign = "-"; text = text.slice(1); }
  let [whole, frac = ""] = text.split(".");
  if (frac.length > 6) {  // round half up at six decimals, on the digits (no floats)
    const up = Number(frac[6]) >= 5 ? 1n : 0n;
    const n = (BigInt(whole + frac.slice(0, 6)) + up).toString().padStart(7, "0");
    whole = n.slice(0, -6); frac = n.slice(-6).replace(/0+$/, "");
  }
  frac = frac.padEnd(2, "0");
  if (/^0+$/.test(whole + frac)) sign = "";
  return sign + "$" + whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",") + "." + frac;
}

function cost(fig) {
  // the known cost, and how many attempts have none; nothing known: "unknown", never $0
  if (fig.unknown_cost_attempts && /^[0.]+$/.test(plain(fig.cost_usd))) return "unknown";
  return usd(fig.cost_usd) + (fig.unknown_cost_attempts ? ` + ${fig.unknown_cost_attempts} unknown` : "");
}

const count = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"));
const percent = (s) => (s === null || s === undefined ? "-" : `${s}%`);
// "saving" is what the succeeded attempts saved against real time (report.py
// `succeeded_saving_usd`): a failed attempt's spend is never shown as a saving.
const saving = (c) => field("saving_usd", c.succeeded_saving_usd, `${usd(c.succeeded_saving_usd)} (${percent(c.succeeded_saving_percent)})`);
const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 16) : "-");
const clock = (t) => (t ? new Date(t * 1000).toISOString().slice(11, 19) : "-");

function duration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 90) return `${Math.max(1, Math.round(s))} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 129600) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} days`;
}

// DOM helpers ----------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function field(name, value, text, attrs = {}) {
  // one figure: its text, and the exact value it was made from
  const raw = value === null || value === undefined ? "" : String(value);
  return el("span", { "data-field": name, "data-value": raw, title: raw, ...attrs }, text);
}

function rows(table, header, items) {
  const head = header ? [el("tr", {}, ...header.map((h, i) => el("th", { class: i ? "num" : "" }, h)))] : [];
  const body = items.length ? items : [el("tr", {}, el("td", { class: "muted" }, "none"))];
  table.replaceChildren(...head, ...body);
}

const cell = (child, cls, label) => el("td", { class: cls, "data-label": label }, child);

function stateBar(p, big = false) {
  // one segment per state, its width its share of the requests; the title says the counts
  const total = p.total || 0;
  const words = STATES.filter(([k]) => p[k]).map(([k, w]) => `${count(p[k])} ${w}`).join(", ") || "no requests";
  return el("span", { class: big ? "bar big" : "bar", "data-bar": "", role: "img", title: words, "aria-label": `${words} of ${count(total)}` },
    ...STATES.map(([k]) => el("span", { class: `seg ${k}`, "data-state": k, "data-count": p[k] || 0,
      style: `width:${total ? ((100 * (p[k] || 0)) / total).toFixed(3) : 0}%` })));
}

// Rendering ------------------------------------------------------------------------------
function renderTotals(data) {
  const t = data.total;
  const tiles = [
    ["cost", field("cost_usd", t.cost_usd, cost(t))],
    ["real-time equivalent", field("realtime_usd", t.realtime_usd, usd(t.realtime_usd))],
    ["saving", saving(t)],
    ["tokens in / out", el("span", {}, field("input_tokens", t.input_tokens, count(t.input_tokens)), " / ",
      field("output_tokens", t.output_tokens, count(t.output_tokens)))],
    ["failed requests", field("failed_requests", data.failure_figures.requests, count(data.failure_figures.requests), { class: data.failure_figures.requests ? "bad" : "" })],
    ["attempts (tries)", field("attempts", t.attempts, count(t.attempts))],
    ["failed attempts", field("failures", t.failures, `${count(t.failures)} (${count(t.billed_failures)} billed)`)],
    data.api_jobs === false
      ? ["serve's API batch jobs", field("api_jobs_hidden", data.api_jobs_hidden,
        data.api_jobs_hidden ? `${count(data.api_jobs_hidden)} not listed (?api_jobs=true)` : "none")]
      : ["API batches", field("api_batches", JSON.stringify(data.api_batches),
        Object.entries(data.api_batches).map(([s, n]) => `${n} ${s}`).join(", ") || "none")],
  ];
  document.querySelector("#totals .tiles").replaceChildren(
    ...tiles.map(([label, value]) => el("div", { class: "tile" }, el("div", { class: "label" }, label), el("div", { class: "value" }, value))),
  );
}

function renderJobs(data) {
  document.getElementById("job-count").textContent =
    data.job_count > data.jobs.length ? `(newest ${data.jobs.length} of ${data.job_count})` : `(${data.job_count})`;
  const items = data.jobs.map((job) => {
    const c = job.cost;
    const row = el("tr", { "data-job": job.name, class: job.name === selected ? "selected" : "" },
      cell(el("strong", {}, job.name), "wide", ""), cell(field("state", job.state, job.state), "", "state"), cell(job.route, "", "route"),
      cell(el("span", {}, stateBar(job.progress),
        field("done", job.done, count(job.done)), " / ", field("total", job.total, count(job.total))), "", "done"),
      cell(field("failed", job.failed, count(job.failed), { class: job.failed ? "bad" : "" }), "num", "failed"),
      cell(field("cost_usd", c.cost_usd, cost(c)), "num", "cost"),
      cell(field("realtime_usd", c.realtime_usd, usd(c.realtime_usd)), "num", "real time"),
      cell(saving(c), "num", "saving"),
      cell(el("span", {}, field("input_tokens", c.input_tokens, count(c.input_tokens)), " / ",
        field("output_tokens", c.output_tokens, count(c.output_tokens))), "num", "tokens in / out"));
    row.addEventListener("click", () => select(job.name));
    return row;
  });
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren(...(items.length ? items : [el("tr", {}, el("td", { colspan: 9, class: "muted" }, "no jobs in this store yet"))]));
}

function renderFailures(job, failures, total) {
  // the selected job's failed requests by reason, or every job's
  document.getElementById("failures-title").textContent = `Failed requests by reason: ${job ? `job ${job}` : "all jobs"}`;
  document.getElementById("failures-box").dataset.job = job || "";
  document.getElementById("failed-total").textContent = `(${count(total)})`;
  const entries = Object.entries(failures);
  const most = Math.max(1, ...entries.map(([, n]) => n));
  const box = document.getElementById("failures");
  box.replaceChildren(...(entries.length ? entries.map(([reason, n]) => el("div", { class: "hbar", "data-reason": reason },
    el("span", {}, reason), el("div", { class: "fill", style: `width:${(100 * n) / most}%` }), el("span", { class: "num" }, count(n))))
    : [el("p", { class: "muted" }, "no failed requests")]));
}

function renderSeries(data) {
  // grouped bars per time bucket: cost and saving, scaled to the largest
  document.getElementById("series-title").textContent = `Cost and saving over time: ${data.job ? `job ${data.job}` : "all jobs"}`;
  document.getElementById("series-bucket").textContent = `per ${data.bucket}`;
  const svg = document.getElementById("series-chart");
  const width = svg.clientWidth || 600, height = 180, left = 60, bottom = 20, top = 8;
  const points = data.points;
  const shapes = [];
  const line = (x1, y1, x2, y2) => svgEl("line", { x1, y1, x2, y2, stroke: "#dde3ea" });
  if (!points.length) {
    shapes.push(svgEl("text", { x: left, y: height / 2 }, "no attempts yet"));
  } else {
    const most = Math.max(...points.flatMap((p) => [Number(plain(p.cost_usd)), Number(plain(p.saving_usd))]), 1e-12);
    const slot = (width - left) / points.length, bar = Math.max(1, Math.min(24, slot / 2 - 1));
    const y = (v) => height - bottom - ((height - bottom - top) * Math.max(0, v)) / most;
    shapes.push(line(left, height - bottom, width, height - bottom), line(left, top, width, top));
    shapes.push(svgEl("text", { x: 0, y: top + 8 }, usd(most.toFixed(6))), svgEl("text", { x: 0, y: height - bottom }, "$0"));
    points.forEach((p, i) => {
      const x = left + i * slot + slot / 2 - bar;
      for (const [k, color, dx] of [["cost_usd", "var(--cost)", 0], ["saving_usd", "var(--saving)", bar]]) {
        const v = Number(plain(p[k]));
        const rect = svgEl("rect", { x: x + dx, y: y(v), width: bar, height: height - bottom - y(v), fill: color });
        rect.append(svgEl("title", {}, `${when(p.t)}: ${k === "cost_usd" ? "cost" : "saving"} ${usd(p[k])}` +
          (p.unknown_cost_attempts ? `, ${p.unknown_cost_attempts} attempt(s) of unknown cost` : "")));
        shapes.push(rect);
      }
    });
    shapes.push(svgEl("text", { x: left, y: height - 4 }, when(points[0].t)));
    if (points.length > 1) shapes.push(svgEl("text", { x: width, y: height - 4, "text-anchor": "end" }, when(points.at(-1).t)));
  }
  svg.replaceChildren(...shapes);
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fact(label, value) {
  return el("div", {}, el("div", { class: "label" }, label), el("div", {}, value));
}

function renderDetail(job) {
  const box = document.getElementById("detail");
  box.hidden = false;
  box.dataset.job = job.name;
  document.getElementById("detail-name").textContent = job.name;
  document.getElementById("detail-state").replaceChildren(
    field("state", job.state, job.state), ` on ${job.route}, `, field("done", job.done, count(job.done)), " of ",
    field("total", job.total, count(job.total)), " done");
  const p = job.progress, f = job.failure_figures, c = job.cost;
  document.getElementById("detail-progress").replaceChildren(
    stateBar(p, true),
    el("div", { class: "legend" }, ...STATES.map(([k, w]) => el("span", {}, el("i", { class: `swatch ${k}` }),
      field(k, p[k], count(p[k]), k === "failed" && p[k] ? { class: "bad" } : {}), ` ${w}`))));
  const eta = job.eta;
  const est = job.estimate;
  const facts = [
    ["time left (at the rate so far)", eta
      ? el("span", {}, field("eta", eta.remaining_s, `about ${duration(eta.remaining_s)}`), ` (≈ ${when(eta.at)}, ${eta.rate_per_s < 1 ? `${(eta.rate_per_s * 60).toFixed(1)}/min` : `${eta.rate_per_s.toFixed(1)}/s`})`)
      : field("eta", "", p.pending ? "not known yet (nothing finished)" : "nothing left")],
    ["cost so far / estimate", el("span", {}, field("cost_so_far", c.cost_usd, cost(c)), " of ",
      field("estimate_usd", est.usd, est.usd === null ? `unknown (${est.note || "no price"})` : `≤ ${usd(est.usd)}`),
      est.usd !== null && est.note ? el("span", { class: "muted", "data-field": "estimate_note" }, ` (${est.note})`) : "")],
    ["failed requests", el("span", {}, field("failed_requests", f.requests, count(f.requests), { class: f.requests ? "bad" : "" }),
      " · ", field("failed_attempts", f.attempts, `${count(f.attempts)} failed attempts (${count(f.billed_attempts)} billed)`))],
    ["created / finished", el("span", {}, field("created_at", job.created_at, when(job.created_at)), " / ",
      field("finished_at", job.finished_at || "", job.finished_at ? when(job.finished_at) : "-"))],
  ];
  if (job.budget_usd !== null) facts.push(["budget", field("budget", job.budget_usd, `${usd(job.budget_usd)} (${usd(job.reserved_usd)} reserved)`)]);
  document.getElementById("detail-facts").replaceChildren(...facts.map(([k, v]) => fact(k, v)));
  renderTimeline(job);
  renderReasons(job.failures);

  const figures = [
    ["cost", field("cost_usd", c.cost_usd, cost(c))],
    ["real-time equivalent", field("realtime_usd", c.realtime_usd, usd(c.realtime_usd))],
    ["saving (succeeded)", field("saving_usd", c.succeeded_saving_usd, usd(c.succeeded_saving_usd))],
    ["saving %", field("saving_percent", c.succeeded_saving_percent, percent(c.succeeded_saving_percent))],
    ["unknown-cost attempts", field("unknown_cost_attempts", c.unknown_cost_attempts, count(c.unknown_cost_attempts))],
    ["input tokens", field("input_tokens", c.input_tokens, count(c.input_tokens))],
    ["cached input", field("cached_input_tokens", c.cached_input_tokens, count(c.cached_input_tokens))],
    ["cache writes", field("cache_write_tokens", c.cache_write_tokens, count(c.cache_write_tokens))],
    ["output tokens", field("output_tokens", c.output_tokens, count(c.output_tokens))],
    ["reasoning tokens", field("reasoning_tokens", c.reasoning_tokens, count(c.reasoning_tokens))],
    ["cache hits", field("cache_hit_share", c.cache_hit_share, c.cache_hit_share === null ? "-" : `${(100 * Number(c.cache_hit_share)).toFixed(1)}%`)],
    ["attempts (tries)", field("attempts", c.attempts, count(c.attempts))],
    ["failed attempts", field("failures", c.failures, `${count(c.failures)} (${count(c.billed_failures)} billed)`)],
    ["stale results", field("stale_attempts", c.stale_attempts, `${count(c.stale_attempts)} (${usd(c.stale_usd)})`)],
    ["repair attempts", field("repair_attempts", c.repair_attempts, `${count(c.repair_attempts)} (${usd(c.repair_usd)})`)],
  ];
  if (job.budget_usd !== null) figures.push(["budget", field("budget_usd", job.budget_usd, `${usd(job.budget_usd)} (${usd(job.reserved_usd)} reserved)`)]);
  rows(document.getElementById("detail-figures"), null, figures.map(([k, v]) => el("tr", {}, cell(k, "muted"), cell(v, "num"))));
  const pairs = (obj) => Object.entries(obj).map(([k, n]) => el("tr", { "data-key": k }, cell(k), cell(count(n), "num")));
  rows(document.getElementById("detail-counts"), null, pairs(job.counts));
  rows(document.getElementById("detail-phases"), null, pairs(job.phases));
  rows(document.getElementById("detail-failures"), null, pairs(job.failures));
  rows(document.getElementById("detail-placement"), ["route", "moved because", "state", "requests"],
    job.placement.map((p) => el("tr", {}, cell(p.route), cell(p.reason || "-", "num"), cell(p.state, "num"), cell(count(p.count), "num"))));
  // a route: auto chain's tiers (engine/tiers.py), in the chain's order; other jobs have none
  document.getElementById("detail-tiers-box").hidden = job.tiers.length === 0;
  rows(document.getElementById("detail-tiers"), ["tier", "state", "requests"],
    job.tiers.map((t) => el("tr", { "data-tier": t.tier }, cell(t.tier), cell(t.state, "num"), cell(count(t.count), "num"))));
  rows(document.getElementById("detail-routes"), ["route", "tier", "cost", "saving"],
    job.routes.map((g) => el("tr", { "data-route": g.group }, cell(g.group), cell(g.tiers.join(", ") || "-", "num"),
      cell(cost(g), "num"), cell(`${usd(g.succeeded_saving_usd)} (${percent(g.succeeded_saving_percent)})`, "num"))));
  document.getElementById("detail-events").replaceChildren(...job.events.map((e) => el("li", {}, e)));
}

function renderReasons(failures) {
  // the reason filter lists the job's reasons; the choice survives a refresh
  const select = document.getElementById("failed-reason");
  const wanted = ["", ...Object.keys(failures)];
  if (failedView.reason && !wanted.includes(failedView.reason)) wanted.push(failedView.reason);
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") !== wanted.join("\n")) {
    select.replaceChildren(...wanted.map((r) => el("option", { value: r }, r ? `${r} (${count(failures[r] || 0)})` : "all")));
  }
  select.value = failedView.reason;
}

function renderFailedRows(page) {
  const body = document.querySelector("#failed-rows tbody");
  const items = page.rows.map((r) => el("tr", { "data-custom-id": r.custom_id },
    cell(el("code", {}, r.custom_id), "", "custom_id"), cell(el("span", { "data-col": "reason" }, r.reason), "", "reason"),
    cell(el("span", { "data-col": "message" }, r.message || "-"), "wrap wide", "message"),
    cell(el("span", { "data-col": "attempts" }, count(r.attempts)), "num", "attempts"), cell(r.route || "-", "", "route")));
  body.replaceChildren(...(items.length ? items : [el("tr", {}, el("td", { colspan: 5, class: "muted", "data-label": "" },
    page.reason || page.q ? "no failed request matches" : "no failed requests"))]));
  const first = page.total ? page.offset + 1 : 0, last = page.offset + page.rows.length;
  document.getElementById("failed-range").textContent = `${count(first)}–${count(last)} of ${count(page.total)}`;
  document.getElementById("failed-count").textContent = `(${count(page.total)}${page.reason || page.q ? " matching" : ""})`;
  document.getElementById("failed-prev").disabled = page.offset <= 0;
  document.getElementById("failed-next").disabled = last >= page.total;
}

function textBox(col, text, length, max, none) {
  // a text as text (never markup), cut at the server's max, its whole length told
  const cut = text !== null && length > text.length;
  return el("div", { class: "answer-box" },
    el("div", { class: text === null ? "answer muted" : "answer", "data-col": col }, text === null ? none : text),
    ...(cut ? [el("div", { class: "muted" }, `first ${count(max)} of ${count(length)} characters`)] : []));
}

function renderAnswers(page) {
  // each answer beside the request it answered (its last user turn's text)
  const items = page.rows.map((r) => el("tr", { "data-custom-id": r.custom_id },
    cell(el("code", {}, r.custom_id), "", "custom_id"),
    cell(textBox("prompt", r.prompt, r.prompt_length, page.max_chars, `(no text: a ${r.endpoint} request)`), "wrap wide", "request"),
    cell(textBox("answer", r.answer, r.length, page.max_chars, "(no text answer)"), "wrap wide", "answer"),
    cell(el("span", { "data-col": "attempts" }, count(r.attempts)), "num", "attempts"), cell(r.route || "-", "", "route")));
  document.querySelector("#answer-rows tbody").replaceChildren(...(items.length ? items
    : [el("tr", {}, el("td", { colspan: 5, class: "muted", "data-label": "" }, page.q ? "no succeeded answer matches" : "no succeeded answers"))]));
  const first = page.total ? page.offset + 1 : 0, last = page.offset + page.rows.length;
  document.getElementById("answers-range").textContent = `${count(first)}–${count(last)} of ${count(page.total)}`;
  document.getElementById("answers-count").textContent = `(${count(page.total)}${page.q ? " matching" : ""})`;
  document.getElementById("answers-prev").disabled = page.offset <= 0;
  document.getElementById("answers-next").disabled = last >= page.total;
}

function renderTimeline(job) {
  // one line per provider batch: created, each phase when first seen, ended, and its
  // requests; the track places the batch's life on the span of all its batches
  const batches = job.batches;
  document.getElementById("batch-count").textContent =
    job.batch_count > batches.length ? `(newest ${batches.length} of ${job.batch_count})` : `(${job.batch_count})`;
  const now = Math.max(...batches.flatMap((b) => [b.created_at, b.ended_at || 0, ...b.phases.map((x) => x.at)]), 0);
  const t0 = Math.min(...batches.map((b) => b.created_at)), span = Math.max(now - t0, 1e-9);
  const items = batches.map((b) => {
    const end = b.ended_at || now, left = (100 * (b.created_at - t0)) / span, width = (100 * (end - b.created_at)) / span;
    const phases = b.phases.length
      ? b.phases.map((x) => `${x.phase} ${clock(x.at)}`).join(" → ")
      : b.submitted_at ? `submitted ${clock(b.submitted_at)}` : "not sent";
    const k = b.counts;
    return el("tr", { "data-batch": b.provider_id || String(b.id) },
      cell(el("span", {}, el("code", {}, b.provider_id || `#${b.id}`), el("span", { class: "muted" }, ` ${b.route}`)), "wide", "batch"),
      cell(el("span", { "data-col": "state" }, b.state + (b.error ? `: ${b.error}` : "")
        + (b.watch_until ? ` (still polled for what it bills until ${when(b.watch_until)})` : "")), "wrap", "state"),
      cell(el("span", { "data-col": "created" }, when(b.created_at)), "", "created"),
      cell(el("span", { "data-col": "phases" }, phases), "wrap", "phases"),
      cell(el("span", { "data-col": "ended" }, b.ended_at ? when(b.ended_at) : "-"), "", "ended"),
      cell(el("span", { "data-col": "requests", title: "succeeded / failed attempts from this batch / still in it, of its size" },
        `${count(k.succeeded)} ok · ${count(k.failed)} failed · ${count(k.in_batch)} in it / ${count(b.size)}`), "num", "requests"),
      cell(el("div", { class: "track" }, el("span", { class: b.ended_at ? "ended" : "", style: `left:${left.toFixed(2)}%;width:${Math.max(width, 0.5).toFixed(2)}%` })), "wide", "timeline"));
  });
  document.querySelector("#timeline tbody").replaceChildren(...(items.length ? items
    : [el("tr", {}, el("td", { colspan: 7, class: "muted", "data-label": "" }, "no provider batches (a direct route, or nothing sent yet)"))]));
}

// Polling --------------------------------------------------------------------------------
// A section is drawn again only when what it shows changed: a refresh that brought nothing
// new leaves the page as it was, so a reader's text selection (and a held element) survives.
const drawn = new Map();
function changed(section, ...inputs) {
  const now = JSON.stringify(inputs);
  if (drawn.get(section) === now) return false;
  drawn.set(section, now);
  return true;
}

function hideDetail() {
  document.getElementById("detail").hidden = true;
  drawn.delete("detail");
  drawn.delete("failed");
  drawn.delete("answers");
}

// `?api_jobs=true|false` on the page: every call asks the same (serve's own API batch jobs).
const API_JOBS = new URLSearchParams(location.search).get("api_jobs");

async function get(path) {
  if (API_JOBS !== null) path += `${path.includes("?") ? "&" : "?"}api_jobs=${encodeURIComponent(API_JOBS)}`;
  const response = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw Object.assign(new Error(body.error || `${path}: HTTP ${response.status}`), { status: response.status });
  }
  return response.json();
}

function select(name) {
  if (name !== selected) {
    Object.assign(failedView, { reason: "", q: "", offset: 0 });
    Object.assign(answersView, { q: "", offset: 0 });
  }
  document.getElementById("failed-search").value = failedView.q;
  document.getElementById("answers-search").value = answersView.q;
  const left = selected;
  selected = name;
  reveal = Boolean(name);
  history.replaceState(null, "", name ? `#${encodeURIComponent(name)}` : location.pathname + location.search);
  if (!name) {
    hideDetail();
    // back to the list, at the job left
    const row = left && document.querySelector(`#jobs tr[data-job="${CSS.escape(left)}"]`);
    (row || document.getElementById("jobs")).scrollIntoView({ block: "center" });
  }
  refresh();
}

function failedQuery() {
  const q = new URLSearchParams({ job: selected, offset: failedView.offset, limit: PAGE });
  if (failedView.reason) q.set("reason", failedView.reason);
  if (failedView.q) q.set("q", failedView.q);
  return get(`dashboard/api/failed?${q}`);
}

function answersQuery() {
  const q = new URLSearchParams({ job: selected, offset: answersView.offset, limit: ANSWERS });
  if (answersView.q) q.set("q", answersView.q);
  return get(`dashboard/api/answers?${q}`);
}

async function refresh() {
  clearTimeout(timer);
  const status = document.getElementById("status");
  try {
    const jobsQuery = get("dashboard/api/jobs");
    const seriesQuery = get(`dashboard/api/series${selected ? `?job=${encodeURIComponent(selected)}` : ""}`);
    const detailQuery = selected ? get(`dashboard/api/jobs/${encodeURIComponent(selected)}`) : null;
    const failedRowsQuery = selected ? failedQuery() : null;
    const answerRowsQuery = selected ? answersQuery() : null;
    for (const q of [seriesQuery, detailQuery, failedRowsQuery, answerRowsQuery]) q?.catch(() => {});  // awaited below
    const data = await jobsQuery;
    if (changed("jobs", { ...data, generated_at: null }, selected)) {  // the time it was read is not shown
      renderTotals(data);
      renderJobs(data);
    }
    let job = null;
    try {
      const series = await seriesQuery;
      if (changed("series", series, document.getElementById("series-chart").clientWidth)) renderSeries(series);
      if (detailQuery) {
        job = await detailQuery;
        const rows = await failedRowsQuery, answers = await answerRowsQuery;
        if (changed("detail", job, failedView)) renderDetail(job);
        if (changed("failed", rows, failedView)) renderFailedRows(rows);
        // (a page asked before the filter or page changed is not drawn: the next refresh brings the new one)
        const current = answers.offset === answersView.offset && (answers.q || "") === answersView.q;
        if (current && changed("answers", answers)) renderAnswers(answers);
        if (reveal) document.getElementById("detail").scrollIntoView({ block: "start" });
        reveal = false;
      }
    } catch (err) {
      if (err.status !== 404) throw err;
      job = selected = null;  // the job is gone (or never was): back to all jobs
      hideDetail();
      history.replaceState(null, "", location.pathname + location.search);
    }
    // On a job's page, its failures by reason; otherwise every job's.
    const scope = job ? [job.name, job.failures, job.failure_figures.requests] : [null, data.failures, data.failure_figures.requests];
    if (changed("failures", scope)) renderFailures(...scope);
    status.className = "";
    status.textContent = `updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
  } catch (err) {
    status.className = "error";
    status.textContent = `could not refresh: ${err.message}`;
  } finally {
    timer = setTimeout(refresh, REFRESH_MS);
  }
}

// The filters and pagers ask again at once (a search after a short pause in the typing,
// from its first page).
let typing = null, typingAnswers = null;
document.getElementById("failed-reason").addEventListener("change", (e) => {
  Object.assign(failedView, { reason: e.target.value, offset: 0 });
  refresh();
});
document.getElementById("failed-search").addEventListener("input", (e) => {
  clearTimeout(typing);
  typing = setTimeout(() => { Object.assign(failedView, { q: e.target.value.trim(), offset: 0 }); refresh(); }, 250);
});
document.getElementById("failed-prev").addEventListener("click", () => { failedView.offset = Math.max(0, failedView.offset - PAGE); refresh(); });
document.getElementById("failed-next").addEventListener("click", () => { failedView.offset += PAGE; refresh(); });
document.getElementById("answers-search").addEventListener("input", (e) => {
  clearTimeout(typingAnswers);
  typingAnswers = setTimeout(() => { Object.assign(answersView, { q: e.target.value.trim(), offset: 0 }); refresh(); }, 250);
});
document.getElementById("answers-prev").addEventListener("click", () => { answersView.offset = Math.max(0, answersView.offset - ANSWERS); refresh(); });
document.getElementById("answers-next").addEventListener("click", () => { answersView.offset += ANSWERS; refresh(); });
document.getElementById("detail-close").addEventListener("click", (e) => { e.preventDefault(); select(null); });

refresh();
