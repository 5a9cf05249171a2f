"use strict";
/* Head view (Vig 2019): query tokens on the left, key tokens on the right, one line per stored
   weight with opacity = weight, one colour per head. The canvas is one screen tall and sticks
   while its box (the whole view's height) scrolls past; each draw paints only the rows and lines
   crossing the screen, batched into paths by opacity, so 512 tokens x 16 heads stay interactive. */
const MIN_WEIGHT = 0.01;  // fainter lines are invisible at any opacity; drawn only for a focused token

const HeadView = {
  canvas: null,
  box: null,
  geo: null,
  band: { off: 0, h: 0 },  // the part of the view's height on the canvas now
  hover: null,  // {side: "q" | "k", i} under the mouse, or null
  pending: false,

  init(canvas, box, app) {
    this.canvas = canvas;
    this.box = box;
    const later = () => {
      if (app.state.view !== "head" || this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.draw(app.state); });
    };
    window.addEventListener("scroll", later, { passive: true });
    window.addEventListener("resize", later);
    canvas.addEventListener("mousemove", (e) => this.setHover(this.hit(e), app));
    canvas.addEventListener("mouseleave", () => this.setHover(null, app));
    canvas.addEventListener("click", (e) => {
      const at = this.hit(e);
      if (at && at.side === "q") app.set({ token: app.state.token === at.i ? -1 : at.i });
    });
  },

  setHover(at, app) {
    const same = at && this.hover && at.side === this.hover.side && at.i === this.hover.i;
    if (same || (!at && !this.hover)) return;
    this.hover = at;
    this.draw(app.state);
  },

  hit(e) {
    const r = this.canvas.getBoundingClientRect(), g = this.geo;
    if (!g) return null;
    const x = e.clientX - r.left, i = Math.floor((e.clientY - r.top + this.band.off - g.top) / g.rowH);
    const side = x < (g.x0 + g.x1) / 2 ? "q" : "k";
    return i >= 0 && i < (side === "q" ? g.nq : g.nk) ? { side, i } : null;
  },

  geometry(ctx, G) {
    const nq = G.rows.length, nk = G.cols.length, T = Math.max(nq, nk);
    const rowH = T <= 40 ? 20 : T <= 128 ? 16 : Math.max(2, Math.min(13, Math.floor(30000 / T)));
    const font = `${rowH >= 16 ? 13 : 11}px ${getComputedStyle(document.body).fontFamily}`;
    ctx.font = font;
    const width = (tokens) => Math.min(170, tokens.reduce((m, t) => Math.max(m, ctx.measureText(shortToken(t, 22)).width), 30));
    const wq = width(G.rows), wk = width(G.cols), span = T <= 64 ? 300 : 400;
    const x0 = 18 + wq + 12, x1 = x0 + span;
    return { nq, nk, rowH, font, x0, x1, top: 34, labels: rowH >= 9,
      width: x1 + 12 + wk + 18, height: 34 + T * rowH + 14 };
  },

  draw(state) {
    const G = META.groups[state.g], A = Data.attention(state.g, state.li);
    this.geo = this.geometry(this.canvas.getContext("2d"), G);
    const ctx = this.sized();
    const heads = [...state.heads].filter((h) => h < A.H).sort((a, b) => a - b);
    const focus = this.hover || (state.token >= 0 ? { side: "q", i: state.token } : null);
    const tint = focus ? this.tints(A, heads, focus) : null;
    ctx.font = this.geo.font;
    this.headers(ctx);
    this.labels(ctx, G.rows, "q", focus, tint, state);
    this.labels(ctx, G.cols, "k", focus, tint, state);
    this.lines(ctx, A, heads, focus);
  },

  // a canvas one screen tall, translated to the part of the view it shows
  sized() {
    const g = this.geo, top = document.getElementById("toolbar").offsetHeight + 8;
    this.box.style.setProperty("--sticky", `${top}px`);
    this.box.style.height = `${g.height}px`;
    const h = Math.min(g.height, Math.max(240, window.innerHeight - top - 8));
    const ctx = sizeCanvas(this.canvas, g.width, h);
    const off = this.canvas.getBoundingClientRect().top - this.box.getBoundingClientRect().top;
    this.band = { off: Math.max(0, Math.min(g.height - h, off)), h };
    ctx.translate(0, -this.band.off);
    return ctx;
  },

  // does a line from y0 to y1 cross the part of the view on the canvas?
  seen(y0, y1) {
    return Math.max(y0, y1) >= this.band.off - 2 && Math.min(y0, y1) <= this.band.off + this.band.h + 2;
  },

  headers(ctx) {
    const g = this.geo;
    ctx.save();
    ctx.font = `600 11px ${getComputedStyle(document.body).fontFamily}`;
    ctx.fillStyle = "#697586";
    ctx.textAlign = "right";
    ctx.fillText("QUERY", g.x0 - 12, 18);
    ctx.textAlign = "left";
    ctx.fillText("KEY", g.x1 + 12, 18);
    ctx.restore();
  },

  // per token on the side opposite the focus: [weight, head] of its strongest selected head
  tints(A, heads, focus) {
    const out = new Map();
    const keep = (t, w, h) => { if (!out.has(t) || out.get(t)[0] < w) out.set(t, [w, h]); };
    for (const h of heads) {
      if (focus.side === "q") eachEdge(A, h, focus.i, (j, w) => keep(j, w, h));
      else for (let i = 0; i < A.Tq; i++) eachEdge(A, h, i, (j, w) => { if (j === focus.i) keep(i, w, h); });
    }
    return out;
  },

  labels(ctx, tokens, side, focus, tint, state) {
    const g = this.geo, right = side === "q", x = right ? g.x0 - 12 : g.x1 + 12;
    const segs = state.g === 0 && META.segments && META.segments.length === tokens.length ? META.segments : null;
    ctx.textAlign = right ? "right" : "left";
    ctx.textBaseline = "middle";
    for (let i = 0; i < tokens.length; i++) {
      const y = g.top + i * g.rowH;
      if (!this.seen(y, y + g.rowH)) continue;
      const t = tint && focus.side !== side ? tint.get(i) : null;
      const boxW = right ? g.x0 - 6 - 10 : g.width - g.x1 - 6 - 10, bx = right ? 10 : g.x1 + 6;
      if (focus && focus.side === side && focus.i === i) this.fillRow(ctx, bx, y, boxW, "#dfe7fb", 1);
      if (t) this.fillRow(ctx, bx, y, boxW, headColour(t[1]), Math.min(1, t[0]) * 0.55);
      if (right && state.token === i) this.fillRow(ctx, 4, y, 3, "#2f5bd3", 1);
      if (!g.labels) continue;
      ctx.fillStyle = segs && segs[i] ? "#0b7285" : "#1f2933";
      ctx.fillText(shortToken(tokens[i], 22), x, y + g.rowH / 2 + 0.5);
    }
  },

  fillRow(ctx, x, y, w, colour, alpha) {
    ctx.globalAlpha = alpha;
    ctx.fillStyle = colour;
    ctx.fillRect(x, y + 1, w, this.geo.rowH - 2);
    ctx.globalAlpha = 1;
  },

  lines(ctx, A, heads, focus) {
    const g = this.geo, NB = 24, yq = (i) => g.top + (i + 0.5) * g.rowH;
    const rows = focus && focus.side === "q" ? [focus.i] : [...Array(A.Tq).keys()];
    ctx.lineWidth = g.rowH >= 16 ? 2 : g.rowH >= 9 ? 1.4 : 1;
    for (const h of heads) {
      const paths = Array.from({ length: NB }, () => new Path2D()), used = new Uint8Array(NB);
      for (const i of rows) {
        eachEdge(A, h, i, (j, w) => {
          if (focus ? focus.side === "k" && j !== focus.i : w < MIN_WEIGHT) return;
          if (!this.seen(yq(i), yq(j))) return;
          const b = Math.min(NB - 1, Math.floor(w * NB));
          paths[b].moveTo(g.x0, yq(i));
          paths[b].lineTo(g.x1, yq(j));
          used[b] = 1;
        });
      }
      ctx.strokeStyle = headColour(h);
      for (let b = 0; b < NB; b++) {
        if (!used[b]) continue;
        ctx.globalAlpha = (b + 0.5) / NB;
        ctx.stroke(paths[b]);
      }
    }
    ctx.globalAlpha = 1;
  },
};
