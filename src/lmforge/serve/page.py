"""The page at `/`: try each route from a browser (a text box, the request body, the answer), and
see a model's attention on the text (the analysis view from GET /attention, shown in a frame).

Self-contained: no script or style from elsewhere, so it works offline. A URL hash fills the form
and sends the request when the page loads, e.g. `/#route=embed&text=Hello` (the answer lands in
<pre id="result" data-state="done">), which is how the page is tested in a headless browser.
"""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from lmforge.serve.docs import DOCS_HTML

router = APIRouter(include_in_schema=False)

PAGE_HTML = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lmforge serve</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 15px/1.45 system-ui, sans-serif; margin: 0; background: #f5f6f8; color: #1d2330; }
 header { background: #1d2330; color: #fff; padding: 14px 24px; display: flex; gap: 18px;
          align-items: baseline; }
 header h1 { font-size: 20px; margin: 0; } header a { color: #9cc3ff; }
 main { display: grid; grid-template-columns: minmax(320px, 1fr) minmax(320px, 1.2fr); gap: 20px;
        padding: 20px 24px; }
 section { background: #fff; border: 1px solid #d9dde5; border-radius: 8px; padding: 16px; }
 label { display: block; font-weight: 600; margin: 10px 0 4px; }
 select, textarea, button { font: inherit; width: 100%; box-sizing: border-box; }
 textarea { border: 1px solid #c4cad6; border-radius: 6px; padding: 8px; }
 #text { height: 90px; } #body { height: 150px; font-family: ui-monospace, monospace; font-size: 13px; }
 button { margin-top: 12px; background: #2f6fed; color: #fff; border: 0; border-radius: 6px; padding: 10px;
          cursor: pointer; }
 button:hover { background: #2458c5; }
 #status { font-weight: 600; margin-bottom: 8px; } .ok { color: #137333; } .bad { color: #b3261e; }
 #result { white-space: pre-wrap; word-break: break-word; font: 13px/1.4 ui-monospace, monospace;
           background: #f0f2f6; border-radius: 6px; padding: 10px; min-height: 240px; max-height: 70vh;
           overflow: auto; }
 .hint { color: #5a6272; font-size: 13px; }
 #view { display: none; width: calc(100% - 48px); height: 85vh; margin: 0 24px 24px; border: 1px solid #d9dde5;
         border-radius: 8px; background: #fff; }
</style></head>
<body>
<header><h1>lmforge serve</h1><span id="models" class="hint"></span>
<a href="/docs">API reference</a><a href="/openapi.json">openapi.json</a><a href="/metrics">metrics</a>
</header>
<main>
<section>
 <label for="route">Route</label>
 <select id="route">
  <option value="embed">POST /embed: sentence embeddings</option>
  <option value="embeddings">POST /v1/embeddings: OpenAI embeddings</option>
  <option value="predict">POST /predict: fine-tuned task</option>
  <option value="fill_mask">POST /fill_mask: fill [MASK]</option>
  <option value="generate">POST /generate: streamed generation</option>
  <option value="completions">POST /v1/completions: OpenAI completions</option>
  <option value="attention">GET /attention: attention view</option>
  <option value="tokenize">POST /tokenize</option>
  <option value="info">GET /info</option>
  <option value="health">GET /health</option>
 </select>
 <label for="model">Model</label><select id="model"><option value="">(default)</option></select>
 <label for="text">Text</label>
 <textarea id="text">The capital of France is [MASK].</textarea>
 <label for="body">Request body <span class="hint">(built from the text; edit freely)</span></label>
 <textarea id="body" spellcheck="false"></textarea>
 <button id="send">Send</button>
 <p class="hint">Tip: <code>/#route=embed&amp;text=Hello</code> fills this form and sends it on load.</p>
</section>
<section><div id="status" class="hint">No request yet.</div>
<pre id="result" data-state="idle"></pre></section>
</main>
<iframe id="view" title="attention view"></iframe>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const ROUTES = {
  embed: ["POST", "/embed", (t) => ({texts: [t]})],
  embeddings: ["POST", "/v1/embeddings", (t) => ({input: t})],
  predict: ["POST", "/predict", (t) => ({inputs: t})],
  fill_mask: ["POST", "/fill_mask", (t) => ({text: t, top_k: 5})],
  generate: ["POST", "/generate", (t) => ({prompt: t, max_new_tokens: 40, temperature: 0, stream: true})],
  completions: ["POST", "/v1/completions", (t) => ({prompt: t, max_tokens: 40, temperature: 0})],
  attention: ["GET", "/attention", null],
  tokenize: ["POST", "/tokenize", (t) => ({text: t})],
  info: ["GET", "/info", null], health: ["GET", "/health", null],
};
function buildBody() {
  const [, , make] = ROUTES[$("route").value];
  const body = make ? make($("text").value) : null;
  if (body && $("model").value) body.model = $("model").value;
  $("body").value = body ? JSON.stringify(body, null, 2) : "";
}
function show(state, status, text) {
  $("status").textContent = status;
  $("status").className = state === "error" ? "bad" : state === "done" ? "ok" : "hint";
  if (text !== undefined) $("result").textContent = text;
  $("result").dataset.state = state;
}
async function readStream(response) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "", text = "", last = null;
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, cut).replace(/^data: /, "");
      buffer = buffer.slice(cut + 2);
      if (line === "[DONE]") continue;
      const event = JSON.parse(line);
      if (event.finish_reason !== undefined || event.error) { last = event; continue; }
      text += event.text; show("streaming", "streaming…", text);
    }
  }
  return text + "\n\n" + JSON.stringify(last, null, 2);
}
function target(path) {
  if (path !== "/attention") return path;  // the view is asked for by query: text and model
  const query = new URLSearchParams({text: $("text").value});
  if ($("model").value) query.set("model", $("model").value);
  return path + "?" + query;
}
async function showView(response, said) {
  const html = await response.text();
  $("view").style.display = "block";
  $("view").srcdoc = html;  // the view is self-contained: its script and data are inline
  show("done", said, "attention view below (" + Math.round(html.length / 1024) + " kB)");
}
async function send() {
  const [method, path] = ROUTES[$("route").value];
  const started = performance.now();
  show("running", method + " " + path + " …", "");
  try {
    const init = {method, headers: {"Content-Type": "application/json"}};
    if (method === "POST") init.body = $("body").value;
    const response = await fetch(target(path), init);
    const said = () => response.status + " " + method + " " + path + " in "
      + Math.round(performance.now() - started) + " ms";
    if (response.ok && path === "/attention") { await showView(response, said()); return; }
    const stream = (response.headers.get("content-type") || "").startsWith("text/event-stream");
    const text = stream ? await readStream(response)
                        : JSON.stringify(await response.json(), null, 2);
    show(response.ok ? "done" : "error", said(), text);
  } catch (err) { show("error", "request failed", String(err)); }
}
async function loadModels() {
  try {
    const info = await (await fetch("/info")).json();
    for (const [name, m] of Object.entries(info.models)) {
      const option = document.createElement("option");
      option.value = name; option.textContent = name + " (" + m.capabilities.join(", ") + ")";
      $("model").appendChild(option);
    }
    $("models").textContent = Object.keys(info.models).length + " model(s), lmforge " + info.version;
  } catch (err) { $("models").textContent = "cannot read /info"; }
}
async function fromHash() {
  const asked = new URLSearchParams(location.hash.slice(1));
  if (!asked.has("route")) return;
  if (!(asked.get("route") in ROUTES)) { show("error", "unknown route " + asked.get("route"), ""); return; }
  $("route").value = asked.get("route");
  if (asked.has("text")) $("text").value = asked.get("text");
  if (asked.has("model")) $("model").value = asked.get("model");
  buildBody();
  await send();
}
$("route").addEventListener("change", buildBody);
$("model").addEventListener("change", buildBody);
$("text").addEventListener("input", buildBody);
$("send").addEventListener("click", send);
buildBody();
loadModels().then(fromHash);
</script></body></html>
"""


@router.get("/", response_class=HTMLResponse)
async def page() -> HTMLResponse:
    """The try-it page."""
    return HTMLResponse(PAGE_HTML)


@router.get("/docs", response_class=HTMLResponse)
async def docs() -> HTMLResponse:
    """The API reference, rendered from /openapi.json by a self-contained script (works offline)."""
    return HTMLResponse(DOCS_HTML)


@router.get("/docs/swagger", response_class=HTMLResponse)
async def swagger() -> HTMLResponse:
    """FastAPI's Swagger UI: it loads its script from a CDN, so it needs internet access."""
    return get_swagger_ui_html(openapi_url="/openapi.json", title="lmforge serve: Swagger UI")
