"use strict";
const $ = (id) => document.getElementById(id);
const lines = (text) => text.split("\n").map((s) => s.trim()).filter(Boolean);
// route -> its request: the capability a model needs for it (/v1/models), its options' fieldset, its body
const ROUTES = {
  embed: {method: "POST", path: "/embed", can: "embed", group: "embed", make: (t, o) => ({texts: [t], ...o})},
  embeddings: {method: "POST", path: "/v1/embeddings", can: "embed", group: "embed",
               make: (t, o) => ({input: t, ...o})},
  features: {method: "POST", path: "/features", can: "features", group: "features",
             make: (t, o) => ({texts: [t], ...o})},
  rerank: {method: "POST", path: "/rerank", can: "rerank", group: "rerank", make: rerankBody},
  v1_rerank: {method: "POST", path: "/v1/rerank", can: "rerank", group: "rerank", make: rerankBody},
  predict: {method: "POST", path: "/predict", can: "predict", make: (t) => ({inputs: t})},
  fill_mask: {method: "POST", path: "/fill_mask", can: "fill_mask", make: (t) => ({text: t, top_k: 5})},
  generate: {method: "POST", path: "/generate", can: "generate",
             make: (t) => ({prompt: t, max_new_tokens: 40, temperature: 0, stream: true})},
  completions: {method: "POST", path: "/v1/completions", can: "generate",
                make: (t) => ({prompt: t, max_tokens: 40, temperature: 0})},
  attention: {method: "GET", path: "/attention", can: "attention"},
  tokenize: {method: "POST", path: "/tokenize", can: "tokenize", make: (t) => ({text: t})},
  models: {method: "GET", path: "/v1/models"}, info: {method: "GET", path: "/info"},
  health: {method: "GET", path: "/health"},
};
const SAMPLES = {text: "The capital of France is [MASK].",
                 rerank: "Paris is the capital of France.\nBananas are yellow.\nThe Eiffel Tower stands in Paris."};
let MODELS = [];  // /v1/models' data: {id, capabilities}
let sent = null;  // the body of the request in flight (a rerank's documents are shown from it)

function rerankBody(text, options) {
  const {query, ...rest} = options;
  return {query: query || "", documents: lines(text), ...rest};
}
function route() { return ROUTES[$("route").value]; }
function controls(group) {
  return group ? [...document.querySelectorAll(`fieldset[data-group="${group}"] [data-field]`)] : [];
}
function control(group, field) { return controls(group).find((c) => c.dataset.field === field); }
function valueOf(c) {
  if (c.type === "checkbox") return c.checked;
  const raw = c.value.trim();
  if (raw === "") return undefined;  // left empty: the server's default
  if (c.type === "number") return Number(raw);
  if (c.dataset.field === "mix_weights") {  // "0.5, 1, 2" -> [0.5, 1, 2]; anything else is sent for the server to judge
    const weights = raw.split(/[\s,]+/).filter(Boolean).map(Number);
    return weights.some(Number.isNaN) ? raw : weights;
  }
  return raw === "true" || raw === "false" ? raw === "true" : raw;
}
function options(group) {
  const out = {};
  for (const c of controls(group)) {
    const value = valueOf(c);
    if (value !== undefined) out[c.dataset.field] = value;
  }
  return out;
}
function buildBody() {
  const r = route();
  const body = r.make ? r.make($("text").value, options(r.group)) : null;
  if (body && $("model").value) body.model = $("model").value;
  $("body").value = body ? pretty(body) : "";
}
function el(tag, attrs, ...children) {
  const {dataset, ...rest} = attrs || {};
  const node = Object.assign(document.createElement(tag), rest);
  Object.assign(node.dataset, dataset || {});
  node.append(...children.filter((c) => c !== null && c !== undefined).map((c) => (c instanceof Node ? c : String(c))));
  return node;
}
function row(cells, attrs) {
  const tr = el("tr", attrs);
  for (const c of cells) tr.append(c instanceof Node ? c : el("td", {}, c));
  return tr;
}
function table(head, rows) {
  const t = el("table");
  t.append(row(head.map((h) => el("th", {}, h))), ...rows);
  return t;
}
const clip = (text, n) => (text.length > n ? text.slice(0, n) + "…" : text);
const fmt = (x) => (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(4)) : String(x));
function shape(a) {
  const out = [];
  for (; Array.isArray(a); a = a[0]) out.push(a.length);
  return out;
}
function firstNumbers(a, n) {
  while (Array.isArray(a) && Array.isArray(a[0])) a = a[0];
  if (typeof a === "string") return clip(a, 48);  // base64: the packed bytes
  return a.slice(0, n).map(fmt).join(", ") + (a.length > n ? ", …" : "");
}
function featuresSummary(box, answer) {
  for (const item of answer.data) {
    const names = item.tokens ? "layers × tokens × d" : "layers × d";
    const first = (Array.isArray(item.layers) ? "layer " + item.layers[0] : item.layers)
      + (item.tokens ? ", token 0" : "");
    box.append(el("h3", {}, `text ${item.index}: ${item.n_tokens} tokens`, item.truncated ? " (truncated)" : ""),
               el("div", {className: "shape"}, `layers ${JSON.stringify(item.layers)} · pooling ${answer.pooling}`
                  + ` · shape ${shape(item.features).join(" × ")} (${names})`),
               el("div", {className: "numbers"}, `first numbers (${first}): ` + firstNumbers(item.features, 8)));
    if (!item.tokens) continue;
    const rows = item.tokens.slice(0, 64).map((t, i) => row(
      [String(i), t.id === null ? "–" : String(t.id), t.token, JSON.stringify(t.text),
       el("td", {className: "num"}, `${t.start}–${t.end}`)], {className: "token"}));
    box.append(table(["#", "id", "token", "text", "offsets"], rows));
    if (item.tokens.length > 64) box.append(el("p", {className: "hint"}, `… ${item.tokens.length - 64} more tokens`));
  }
}
function rerankSummary(box, answer) {
  const documents = ((sent && sent.documents) || []).map((d) => (typeof d === "string" ? d : d.text));
  box.append(el("div", {className: "shape"}, `${answer.results.length} of ${documents.length} documents, best `
                + `first · ${answer.usage.total_tokens} tokens read`));
  const rows = answer.results.map((r, rank) => row(
    [String(rank + 1), String(r.index),
     el("td", {className: "num"},
        el("span", {className: "bar", style: `width:${Math.round(80 * r.relevance_score)}px`}),
        r.relevance_score.toFixed(6)),
     el("td", {className: r.truncated ? "cut" : ""}, r.truncated ? "truncated" : "whole"),
     clip(r.document ? r.document.text : documents[r.index] || "", 160)],
    {className: "ranked", dataset: {index: r.index}}));
  box.append(table(["rank", "index", "relevance", "read", "document"], rows));
}
function embedSummary(box, answer) {
  const vectors = answer.embeddings || answer.data.map((d) => d.embedding);
  const dim = answer.dim || (Array.isArray(vectors[0]) ? vectors[0].length : "?");
  box.append(el("div", {className: "shape"}, `${vectors.length} vector(s) · encoding ${answer.encoding_format
                || (typeof vectors[0] === "string" ? "base64" : "float")} · dim ${dim}`));
  vectors.slice(0, 8).forEach((v, i) => {
    const input = answer.inputs ? answer.inputs[i] : null;
    const said = input ? ` (${input.tokens} tokens${input.truncated ? ", truncated" : ""}`
                         + `${input.chunks > 1 ? ", " + input.chunks + " chunks" : ""})` : "";
    box.append(el("div", {className: "numbers"}, `${i}${said}: ` + firstNumbers(v, 8)));
  });
}
function markField(param) {
  const field = String(param || "").split(".")[0];
  const named = {model: $("model"), texts: $("text"), input: $("text"), documents: $("text"), text: $("text")};
  const c = named[field] || control(route().group, field);
  if (c) c.classList.add("field-bad");
  return Boolean(c);
}
function refusal(box, status, error) {
  box.dataset.kind = "refusal";
  const limit = String(error.param || "").startsWith("max_");
  const marked = markField(error.param);
  box.append(el("div", {className: "refusal"}, el("b", {}, `Refused (${status})`), ": " + error.message,
                error.param ? el("div", {}, limit ? "limit: " : "field: ", el("code", {}, error.param),
                                 marked ? " (marked in the form)" : "") : null));
}
function summarize(status, answer) {
  const box = $("summary"), group = route().group;
  box.replaceChildren();
  delete box.dataset.kind;
  if (!answer || typeof answer !== "object") return;
  if (answer.error) { refusal(box, status, answer.error); return; }
  const draw = {features: featuresSummary, rerank: rerankSummary, embed: embedSummary}[group];
  if (!draw) return;
  try { draw(box, answer); box.dataset.kind = group; }
  catch (err) { box.replaceChildren(el("p", {className: "hint"}, "cannot summarise the answer: " + err)); }
}
function pretty(answer) {  // indented JSON, each list of numbers on one line
  return JSON.stringify(answer, null, 2).replace(/\[\s+([-+\d.eE,\s]+?)\s+\]/g,
                                                 (all, inner) => "[" + inner.split(/,\s*/).join(", ") + "]");
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
  const {method, path} = route();
  const started = performance.now();
  for (const c of document.querySelectorAll(".field-bad")) c.classList.remove("field-bad");
  $("summary").replaceChildren();
  show("running", method + " " + path + " …", "");
  try {
    const init = {method, headers: {"Content-Type": "application/json"}};
    if (method === "POST") init.body = $("body").value;
    try { sent = method === "POST" ? JSON.parse(init.body) : null; } catch (err) { sent = null; }
    const response = await fetch(target(path), init);
    const said = () => response.status + " " + method + " " + path + " in "
      + Math.round(performance.now() - started) + " ms";
    if (response.ok && path === "/attention") { await showView(response, said()); return; }
    const stream = (response.headers.get("content-type") || "").startsWith("text/event-stream");
    const answer = stream ? null : await response.json();
    summarize(response.status, answer);
    const text = stream ? await readStream(response) : pretty(answer);
    show(response.ok ? "done" : "error", said(), text);
  } catch (err) { show("error", "request failed", String(err)); }
}
function fillModels() {
  const {can} = route(), keep = $("model").value;
  $("model").replaceChildren(new Option("(default)", ""));
  for (const m of MODELS.filter((m) => !can || m.capabilities.includes(can))) {
    $("model").add(new Option(m.id + " (" + m.capabilities.join(", ") + ")", m.id));
  }
  $("model").value = keep;
  if ($("model").value !== keep) $("model").value = "";
  $("model").disabled = !can;
  $("model-hint").textContent = can ? "(the models with capability " + can + ")" : "(this route takes none)";
}
function gateRoutes() {  // a route no served model can answer is shown, but cannot be chosen
  for (const option of $("route").options) {
    const {can} = ROUTES[option.value];
    option.disabled = Boolean(can) && !MODELS.some((m) => m.capabilities.includes(can));
    if (option.disabled) option.textContent += " (no served model can " + can + ")";
  }
  if ($("route").selectedOptions[0].disabled) $("route").value = [...$("route").options].find((o) => !o.disabled).value;
}
function changeRoute() {
  const {group} = route();
  for (const fieldset of document.querySelectorAll("fieldset.options")) {
    fieldset.hidden = fieldset.dataset.group !== group;
  }
  $("text-label").textContent = group === "rerank" ? "Documents (one per line)" : "Text";
  if (Object.values(SAMPLES).includes($("text").value)) {  // untouched: the sample that suits the route
    $("text").value = SAMPLES[group === "rerank" ? "rerank" : "text"];
  }
  fillModels();
  buildBody();
}
async function loadModels() {
  try {
    MODELS = (await (await fetch("/v1/models")).json()).data;
    const info = await (await fetch("/info")).json();
    $("models").textContent = MODELS.length + " model(s), lmforge " + info.version;
  } catch (err) { $("models").textContent = "cannot read /v1/models"; }
  gateRoutes();
  changeRoute();
}
function setControl(c, value) {
  if (c.type === "checkbox") { c.checked = value === "true" || value === "1"; return; }
  if (c.tagName === "SELECT" && ![...c.options].some((o) => o.value === value)) c.add(new Option(value, value));
  c.value = value;  // an unknown choice is kept, for the server to judge
}
async function fromHash() {
  const asked = new URLSearchParams(location.hash.slice(1));
  if (!asked.has("route")) return;
  if (!(asked.get("route") in ROUTES)) { show("error", "unknown route " + asked.get("route"), ""); return; }
  $("route").value = asked.get("route");
  changeRoute();
  for (const c of controls(route().group)) setControl(c, c.dataset.start);  // a link says a whole request
  if (asked.has("text")) $("text").value = asked.get("text");
  if (asked.has("model")) {
    const named = asked.get("model");  // one the page does not offer is sent too: the server says why not
    if (![...$("model").options].some((o) => o.value === named)) $("model").add(new Option(named));
    $("model").value = asked.get("model");
  }
  for (const [field, value] of asked) {
    if (["route", "text", "model"].includes(field)) continue;
    const c = control(route().group, field);
    if (!c) { show("error", `unknown field ${field} for ${route().path} on this page`, ""); return; }
    setControl(c, value);
  }
  buildBody();
  await send();
}
for (const c of document.querySelectorAll("[data-field]")) c.dataset.start = c.type === "checkbox" ? c.checked : c.value;
$("route").addEventListener("change", changeRoute);
$("model").addEventListener("change", buildBody);
$("text").addEventListener("input", buildBody);
document.querySelectorAll("fieldset.options").forEach((f) => f.addEventListener("input", buildBody));
$("send").addEventListener("click", send);
window.addEventListener("hashchange", fromHash);
buildBody();
loadModels().then(fromHash);
