"""The API reference at /docs, for a server without internet access.

FastAPI's own /docs loads Swagger UI from a CDN and is blank offline; this page instead renders
/openapi.json with a small script of its own: every route with its summary, description, request
fields (types, defaults, limits) and responses. Swagger UI stays at /docs/swagger for machines
that can reach the CDN.
"""
from __future__ import annotations

DOCS_HTML = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lmforge serve: API reference</title>
<style>
 body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1000px; padding: 20px;
        color: #1d2330; }
 h1 { margin-bottom: 4px; }
 .op { border: 1px solid #d9dde5; border-radius: 8px; margin: 14px 0; padding: 12px 16px; }
 .method { font-weight: 700; color: #fff; border-radius: 4px; padding: 2px 8px; margin-right: 8px; }
 .GET { background: #2f8f4e; } .POST { background: #2f6fed; }
 .path { font: 600 15px ui-monospace, monospace; }
 table { border-collapse: collapse; width: 100%; margin: 8px 0; }
 td, th { border-bottom: 1px solid #eceef3; padding: 4px 8px; text-align: left; vertical-align: top;
          font-size: 14px; }
 code, .type { font-family: ui-monospace, monospace; font-size: 13px; } .hint { color: #5a6272; }
</style></head>
<body>
<h1>lmforge serve: API reference</h1>
<p class="hint">Rendered from <a href="/openapi.json">/openapi.json</a> without any outside script.
Try the routes on <a href="/">the home page</a>; Swagger UI (needs internet access):
<a href="/docs/swagger">/docs/swagger</a>.</p>
<div id="intro"></div><div id="ops">Loading /openapi.json…</div>
<script>
"use strict";
let spec = null;
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; };
function resolve(schema) {
  while (schema && schema.$ref) schema = spec.components.schemas[schema.$ref.split("/").pop()];
  return schema || {};
}
function typeOf(schema) {
  schema = resolve(schema);
  if (schema.anyOf) return schema.anyOf.map(typeOf).join(" | ");
  if (schema.type === "array") return typeOf(schema.items) + "[]";
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (schema.const !== undefined) return JSON.stringify(schema.const);
  return schema.title && !schema.type ? schema.title : (schema.type || "object");
}
function limits(schema) {
  const keys = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
  const signs = {minimum: ">=", maximum: "<=", exclusiveMinimum: ">", exclusiveMaximum: "<"};
  return keys.filter((k) => schema[k] !== undefined).map((k) => signs[k] + " " + schema[k]).join(", ");
}
function fields(schema) {
  schema = resolve(schema);
  const table = el("table"), head = el("tr");
  ["field", "type", "default", "description"].forEach((h) => head.appendChild(el("th", "", h)));
  table.appendChild(head);
  for (const [name, field] of Object.entries(schema.properties || {})) {
    const row = el("tr"), required = (schema.required || []).includes(name);
    row.appendChild(el("td", "type", name + (required ? " *" : "")));
    row.appendChild(el("td", "type", typeOf(field) + (limits(field) ? " (" + limits(field) + ")" : "")));
    row.appendChild(el("td", "type", field.default === undefined ? "" : JSON.stringify(field.default)));
    row.appendChild(el("td", "", field.description || resolve(field).description || ""));
    table.appendChild(row);
  }
  return table;
}
function operation(path, method, op) {
  const box = el("div", "op"), title = el("div");
  title.appendChild(el("span", "method " + method.toUpperCase(), method.toUpperCase()));
  title.appendChild(el("span", "path", path));
  title.appendChild(el("span", "hint", "  " + (op.summary || "")));
  box.appendChild(title);
  if (op.description) box.appendChild(el("p", "", op.description));
  const body = op.requestBody && op.requestBody.content["application/json"];
  if (body) {
    box.appendChild(el("b", "", "Request body (* required)"));
    box.appendChild(fields(body.schema));
  }
  if (op.parameters && op.parameters.length) {  // GET routes (/attention) take query parameters
    const query = {properties: {}, required: []};
    for (const p of op.parameters) {
      query.properties[p.name] = {...resolve(p.schema), description: p.description || p.schema.description};
      if (p.required) query.required.push(p.name);
    }
    box.appendChild(el("b", "", "Query parameters (* required)"));
    box.appendChild(fields(query));
  }
  const answers = Object.entries(op.responses || {}).map(([code, r]) => {
    const content = r.content || {}, kinds = Object.keys(content);
    const schema = kinds.length && content[kinds[0]].schema;
    const name = schema && schema.$ref ? " (" + schema.$ref.split("/").pop() + ")" : "";
    return code + " " + (r.description || "") + name
      + (kinds.length > 1 ? " [" + kinds.join(", ") + "]" : "");
  });
  box.appendChild(el("p", "hint", "Responses: " + answers.join("; ")));
  return box;
}
fetch("/openapi.json").then((r) => r.json()).then((loaded) => {
  spec = loaded;
  document.title = spec.info.title + " " + spec.info.version + ": API reference";
  $intro(spec.info.description || "");
  const ops = document.getElementById("ops");
  ops.textContent = "";
  for (const [path, methods] of Object.entries(spec.paths))
    for (const [method, op] of Object.entries(methods)) ops.appendChild(operation(path, method, op));
  ops.dataset.state = "done";
});
function $intro(text) { document.getElementById("intro").appendChild(el("p", "", text)); }
</script></body></html>
"""
