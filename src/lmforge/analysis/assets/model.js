"use strict";
/* Model view: a grid of layers x heads, each a thumbnail of its attention matrix (queries down,
   keys across, each pixel the strongest weight it covers). A row of thumbnails is decoded and
   drawn only when it scrolls into sight, so 24 layers cost nothing until looked at. */
const ModelView = {
  grid: null,
  built: null,  // group index the grid was built for
  observer: null,
  drawn: new Set(),

  init(grid, app) {
    this.grid = grid;
    this.app = app;
    this.observer = new IntersectionObserver((entries) => {
      for (const e of entries) if (e.isIntersecting) this.drawRow(Number(e.target.dataset.li));
    }, { rootMargin: "200px" });
  },

  draw(state) {
    if (this.built !== state.g) this.build(state.g);
    for (const el of this.grid.querySelectorAll(".cur")) el.classList.remove("cur");
    const row = this.grid.querySelectorAll(`[data-li="${state.li}"]`);
    for (const el of row) if (el.tagName !== "CANVAS" || state.heads.has(Number(el.dataset.h))) el.classList.add("cur");
    // rows already on screen are drawn now (a screenshot or a test sees them); the rest on scroll
    for (const label of this.grid.querySelectorAll(".ly")) {
      if (label.getBoundingClientRect().top < window.innerHeight + 200) this.drawRow(Number(label.dataset.li));
    }
  },

  size(G) {
    // a column is the canvas, its 1px borders and the 6px gap; the layer labels take ~64px
    const H = Math.max(...G.heads), room = Math.max(320, this.grid.clientWidth - 64);
    return Math.max(36, Math.min(112, Math.floor(room / H) - 8 - 2));
  },

  build(g) {
    const G = META.groups[g], S = this.size(G), H = Math.max(...G.heads);
    this.observer.disconnect();
    this.drawn.clear();
    this.grid.textContent = "";
    this.grid.style.gridTemplateColumns = `auto repeat(${H}, ${S + 2}px)`;
    this.grid.append(document.createElement("div"));
    for (let h = 0; h < H; h++) {
      this.grid.append(Object.assign(document.createElement("div"),
        { className: "hd", textContent: `H${h}`, style: `color:${headColour(h)}` }));
    }
    G.layers.forEach((layer, li) => this.buildRow(G, li, layer, S, H));
    this.built = g;
  },

  buildRow(G, li, layer, S, H) {
    const label = Object.assign(document.createElement("div"), { className: "ly", textContent: `Layer ${layer}` });
    label.dataset.li = li;
    this.grid.append(label);
    for (let h = 0; h < H; h++) {
      const c = document.createElement(h < G.heads[li] ? "canvas" : "div");
      Object.assign(c.dataset, { li, h });
      if (c.tagName === "CANVAS") {
        c.width = c.height = S;
        c.title = `layer ${layer}, head ${h}`;
        c.addEventListener("click", () => this.app.set({ view: "head", li, heads: new Set([h]), head: h }));
      }
      this.grid.append(c);
    }
    this.observer.observe(label);
  },

  drawRow(li) {
    if (this.drawn.has(li)) return;
    this.drawn.add(li);
    const A = Data.attention(this.built, li);
    for (const c of this.grid.querySelectorAll(`canvas[data-li="${li}"]`)) this.thumb(c, A, Number(c.dataset.h));
  },

  // the strongest weight under each pixel, as the head's colour over white (sqrt: faint rows show)
  thumb(canvas, A, h) {
    const gq = Math.min(A.Tq, canvas.height), gk = Math.min(A.Tk, canvas.width);
    const cell = new Float32Array(gq * gk);
    for (let i = 0; i < A.Tq; i++) {
      const o = Math.floor((i * gq) / A.Tq) * gk;
      eachEdge(A, h, i, (j, w) => {
        const p = o + Math.floor((j * gk) / A.Tk);
        if (w > cell[p]) cell[p] = w;
      });
    }
    const small = document.createElement("canvas");
    small.width = gk;
    small.height = gq;
    const sctx = small.getContext("2d"), img = sctx.createImageData(gk, gq), [r, g, b] = rgbOf(headColour(h));
    for (let p = 0, d = img.data; p < cell.length; p++) {
      const a = Math.sqrt(cell[p]);
      d[4 * p] = 255 + (r - 255) * a;
      d[4 * p + 1] = 255 + (g - 255) * a;
      d[4 * p + 2] = 255 + (b - 255) * a;
      d[4 * p + 3] = 255;
    }
    sctx.putImageData(img, 0, 0);
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(small, 0, 0, canvas.width, canvas.height);
  },

  canvases() {
    return [...this.grid.querySelectorAll("canvas")].filter((c) => this.drawn.has(Number(c.dataset.li)));
  },
};
