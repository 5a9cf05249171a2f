"use strict";
/* Neuron view (Vig 2019): for one layer, head and query token, the query vector q, every key's
   vector k, their elementwise product q x k, the score q.k x scale and the attention weight the
   model used (which also holds any position bias and mask, so it need not be softmax of the score). */
const NeuronView = {
  canvas: null,
  msg: null,

  init(canvas, msg, app) {
    this.canvas = canvas;
    this.msg = msg;
    this.app = app;
  },

  draw(state) {
    const G = META.groups[state.g], QK = Data.qk(state.g, state.li);
    this.msg.textContent = "";
    if (!QK) return this.unavailable(state, G);
    const A = Data.attention(state.g, state.li), h = Math.min(state.head, A.H - 1);
    const i = Math.max(0, state.token), dh = QK.dh;
    const q = QK.q.subarray((h * A.Tq + i) * dh, (h * A.Tq + i + 1) * dh);
    const keys = (j) => QK.k.subarray((h * A.Tk + j) * dh, (h * A.Tk + j + 1) * dh);
    const weights = rowWeights(A, h, i);
    const scores = Float32Array.from({ length: A.Tk }, (_, j) => G.scale * dot(q, keys(j)));
    const order = [...Array(A.Tk).keys()];
    if (state.sort) order.sort((a, b) => weights[b] - weights[a] || scores[b] - scores[a]);
    const geo = this.geometry(G, dh);
    const ctx = sizeCanvas(this.canvas, geo.width, geo.height);
    ctx.font = geo.font;
    this.header(ctx, geo, G.rows[i], q, h);
    const kmax = maxAbs(QK.k.subarray(h * A.Tk * dh, (h + 1) * A.Tk * dh));
    let pmax = 1e-12;
    for (let j = 0; j < A.Tk; j++) pmax = Math.max(pmax, maxAbs(keys(j).map((v, d) => v * q[d])));
    const smax = Math.max(1e-12, maxAbs(scores));
    order.forEach((j, r) => this.row(ctx, geo, r, { token: G.cols[j], k: keys(j), q, w: weights[j],
      s: scores[j], kmax, pmax, smax, colour: headColour(h) }));
  },

  unavailable(state, G) {
    sizeCanvas(this.canvas, 0, 0);
    const kept = G.layers.filter((_, li) => G.qk[li]);
    if (!kept.length) {
      this.msg.textContent = `The neuron view needs q and k, which this page does not hold for ${G.name} attention.`;
      return;
    }
    this.msg.textContent = `q and k of layer ${G.layers[state.li]} were left out to keep the file small; kept for layers:`;
    for (const layer of kept) {
      const b = Object.assign(document.createElement("button"), { type: "button", className: "link", textContent: layer });
      b.addEventListener("click", () => this.app.set({ li: G.layers.indexOf(layer) }));
      this.msg.append(b);
    }
  },

  geometry(G, dh) {
    const n = G.cols.length, rowH = n <= 128 ? 15 : Math.max(4, Math.min(12, Math.floor(30000 / n)));
    const cw = Math.max(2, Math.min(12, Math.floor(300 / dh))), vec = cw * dh;
    const xk = 150, xp = xk + vec + 24, xs = xp + vec + 24, xw = xs + 140;
    return { rowH, cw, vec, xk, xp, xs, xw, top: 84, width: xw + 125,
      height: 84 + n * rowH + 10, font: `11.5px ${getComputedStyle(document.body).fontFamily}` };
  },

  header(ctx, geo, token, q, h) {
    const fill = (text, x, y, align, colour) => {
      ctx.textAlign = align;
      ctx.fillStyle = colour || "#697586";
      ctx.fillText(text, x, y);
    };
    ctx.textBaseline = "middle";
    ctx.font = `600 12px ${getComputedStyle(document.body).fontFamily}`;
    fill(shortToken(token, 18), geo.xk - 10, 20, "right", "#1f2933");
    fill(`q  (head ${h})`, geo.xk + geo.vec + 10, 20, "left", headColour(h));
    this.cells(ctx, geo, geo.xk, 12, q, maxAbs(q), 16);
    ctx.font = `600 11px ${getComputedStyle(document.body).fontFamily}`;
    fill("KEY", geo.xk - 10, 66, "right");
    fill("k", geo.xk, 66, "left");
    fill("q × k", geo.xp, 66, "left");
    fill("q·k × scale", geo.xs, 66, "left");
    fill("weight", geo.xw, 66, "left");
    ctx.font = geo.font;
  },

  cells(ctx, geo, x, y, values, max, height) {
    for (let d = 0; d < values.length; d++) {
      ctx.fillStyle = diverging(values[d] / (max || 1));
      ctx.fillRect(x + d * geo.cw, y, geo.cw - (geo.cw > 3 ? 1 : 0), height);
    }
  },

  row(ctx, geo, r, v) {
    const y = geo.top + r * geo.rowH, hgt = geo.rowH - 2, mid = geo.xs + 38;
    ctx.globalAlpha = v.w >= 1 / 512 ? 1 : 0.35;  // keys the row does not attend (mask, or not stored)
    if (geo.rowH >= 9) {
      ctx.textAlign = "right";
      ctx.fillStyle = "#1f2933";
      ctx.fillText(shortToken(v.token, 18), geo.xk - 10, y + geo.rowH / 2);
    }
    this.cells(ctx, geo, geo.xk, y, v.k, v.kmax, hgt);
    this.cells(ctx, geo, geo.xp, y, v.k.map((k, d) => k * v.q[d]), v.pmax, hgt);
    const sw = (36 * v.s) / v.smax;
    ctx.fillStyle = diverging(v.s / v.smax);
    ctx.fillRect(Math.min(mid, mid + sw), y, Math.abs(sw), hgt);
    ctx.fillStyle = "#c5cbd4";
    ctx.fillRect(mid, y - 1, 1, geo.rowH);
    ctx.fillStyle = v.colour;
    ctx.fillRect(geo.xw, y, 70 * v.w, hgt);
    if (geo.rowH >= 9) {
      ctx.textAlign = "left";
      ctx.fillStyle = "#697586";
      ctx.fillText(v.s.toFixed(2), mid + 44, y + geo.rowH / 2);
      ctx.fillText(v.w.toFixed(3), geo.xw + 74, y + geo.rowH / 2);
    }
    ctx.globalAlpha = 1;
  },
};

function dot(a, b) {
  let s = 0;
  for (let d = 0; d < a.length; d++) s += a[d] * b[d];
  return s;
}

function maxAbs(values) {
  let m = 0;
  for (let i = 0; i < values.length; i++) m = Math.max(m, Math.abs(values[i]));
  return m;
}
