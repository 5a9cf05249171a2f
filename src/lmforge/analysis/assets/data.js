"use strict";
/* The page's data: META (tokens, layers, heads, encodings) and per layer and group two base64
   blocks, attention ("a") and q/k ("q"), decoded on first use so a page of 24 layers opens as fast
   as a page of one. Typed arrays read the platform's byte order: little-endian, as written. */
const META = JSON.parse(document.getElementById("lmf-meta").textContent);

// every half-precision value, so decoding float16 is one table lookup
const F16 = (() => {
  const t = new Float32Array(65536);
  for (let i = 0; i < 65536; i++) {
    const s = i & 0x8000 ? -1 : 1, e = (i >> 10) & 31, f = i & 1023;
    if (e === 0) t[i] = s * f * 2 ** -24;
    else if (e === 31) t[i] = f ? NaN : s * Infinity;
    else t[i] = s * (1 + f / 1024) * 2 ** (e - 15);
  }
  return t;
})();

function blockBytes(id) {
  const text = document.getElementById(id).textContent;
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
  const bin = atob(text), out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function halves(bytes, offset, n) {
  const u = new Uint16Array(bytes.buffer, bytes.byteOffset + offset, n);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = F16[u[i]];
  return out;
}

const Data = {
  cache: new Map(),

  cached(key, make) {
    if (!this.cache.has(key)) this.cache.set(key, make());
    return this.cache.get(key);
  },

  // layer entry li of group g: {H, Tq, Tk, k, dense} or {H, Tq, Tk, k, idx, w8} (top-k rows)
  attention(g, li) {
    return this.cached(`${g}:${li}:a`, () => {
      const G = META.groups[g], H = G.heads[li], Tq = G.rows.length, Tk = G.cols.length;
      const bytes = blockBytes(`b${g}-${li}-a`);
      if (G.k === null) return { H, Tq, Tk, k: Tk, dense: halves(bytes, 0, H * Tq * Tk) };
      const n = H * Tq * G.k;
      return { H, Tq, Tk, k: G.k, idx: new Uint16Array(bytes.buffer, bytes.byteOffset, n),
        w8: bytes.subarray(2 * n, 3 * n) };
    });
  },

  // q (H, Tq, dh) and k (H, Tk, dh) of layer entry li, or null where they were not kept
  qk(g, li) {
    const G = META.groups[g];
    if (!G.qk[li]) return null;
    return this.cached(`${g}:${li}:q`, () => {
      const H = G.heads[li], dh = G.dh[li], nq = H * G.rows.length * dh, nk = H * G.cols.length * dh;
      const bytes = blockBytes(`b${g}-${li}-q`);
      return { H, dh, q: halves(bytes, 0, nq), k: halves(bytes, 2 * nq, nk) };
    });
  },
};

// calls fn(j, w) for every stored key j of query row i of head h with a visible weight
function eachEdge(A, h, i, fn) {
  if (A.dense) {
    const o = (h * A.Tq + i) * A.Tk;
    for (let j = 0; j < A.Tk; j++) if (A.dense[o + j] >= 1 / 512) fn(j, A.dense[o + j]);
    return;
  }
  const o = (h * A.Tq + i) * A.k;
  for (let r = 0; r < A.k; r++) if (A.w8[o + r]) fn(A.idx[o + r], A.w8[o + r] / 255);
}

// the stored weights of row i of head h as a dense row (keys not stored read 0)
function rowWeights(A, h, i) {
  const out = new Float32Array(A.Tk);
  if (A.dense) out.set(A.dense.subarray((h * A.Tq + i) * A.Tk, (h * A.Tq + i + 1) * A.Tk));
  else eachEdge(A, h, i, (j, w) => { out[j] = w; });
  return out;
}

// strong, distinct colours for heads; beyond them the golden angle keeps neighbours apart
const PALETTE = ["#1c7ed6", "#f76707", "#2f9e44", "#e03131", "#7048e8", "#1098ad", "#d6336c", "#74b816",
  "#ae3ec9", "#f59f00", "#4263eb", "#0ca678", "#a61e4d", "#5c940d", "#862e9c", "#8d6e63"];

function headColour(h) {
  return h < PALETTE.length ? PALETTE[h] : `hsl(${(h * 137.5) % 360}, 62%, 44%)`;
}

function rgbOf(colour) {
  const ctx = rgbOf.ctx || (rgbOf.ctx = document.createElement("canvas").getContext("2d"));
  ctx.fillStyle = colour;  // the canvas normalises any CSS colour to #rrggbb
  const hex = ctx.fillStyle;
  return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
}

// a diverging colour for t in [-1, 1]: blue below zero, white at zero, burnt orange above
function diverging(t) {
  const a = Math.min(1, Math.abs(t)) ** 0.75, c = t < 0 ? [33, 102, 172] : [194, 65, 12];
  const m = (x) => Math.round(255 + (x - 255) * a);
  return `rgb(${m(c[0])},${m(c[1])},${m(c[2])})`;
}

// a canvas of w x h CSS pixels, sharp on dense screens but never above ~32M device pixels
function sizeCanvas(canvas, w, h) {
  const dpr = Math.max(1, Math.min(window.devicePixelRatio || 1, Math.sqrt(3.2e7 / (w * h)),
    32000 / h, 32000 / w));
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}

// FNV-1a over the canvases' pixels: lets a test see that a control changed what is drawn
function checksum(canvases) {
  let hash = 2166136261;
  for (const c of canvases) {
    if (!c.width || !c.height) continue;
    const px = new Uint32Array(c.getContext("2d").getImageData(0, 0, c.width, c.height).data.buffer);
    for (let i = 0; i < px.length; i++) hash = Math.imul(hash ^ px[i], 16777619);
  }
  return (hash >>> 0).toString(16).padStart(8, "0");
}

function shortToken(t, n) {
  const s = t.replace(/\s/g, "␣");
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}
