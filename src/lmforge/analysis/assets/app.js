"use strict";
/* The page's state and controls. The URL hash holds the state (#view=model&group=cross&layer=3&
   heads=0,2&head=2&token=5), so a link or a screenshot reproduces a view; #check writes a checksum
   of the drawn pixels into <body data-checksum>, and #selftest drives the controls one by one and
   writes what each drew into the selftest element (what the browser tests read). */
const $ = (id) => document.getElementById(id);
const VIEWS = ["head", "model", "neuron"];

const App = {
  state: { view: "head", g: 0, li: 0, heads: new Set(), head: 0, token: -1, sort: false },
  errors: [],
  check: false,

  init() {
    window.addEventListener("error", (e) => this.errors.push(String(e.message)));
    this.header();
    this.controls();
    HeadView.init($("head-canvas"), $("head-box"), this);
    ModelView.init($("model-grid"), this);
    NeuronView.init($("neuron-canvas"), $("neuron-msg"), this);
    const hash = new URLSearchParams(location.hash.slice(1));
    this.check = hash.has("check") || hash.has("selftest");
    this.set(this.fromHash(hash));
    if (hash.has("selftest")) selftest();
  },

  header() {
    $("title").textContent = META.title || "Attention";
    const G = META.groups[0], chips = Object.entries(META.meta).map(([k, v]) => `${k}: ${v}`);
    // an encoder-decoder reads two texts: count each side's tokens (cross attention has none of its own)
    const sides = META.groups.length > 1 ? META.groups.filter((S) => S.name !== "cross") : [G];
    chips.push(...sides.map((S) => `${S.rows.length} ${sides.length > 1 ? `${S.name} ` : ""}tokens`));
    chips.push(`${G.layers.length} layers`, `${Math.max(...G.heads)} heads`);
    for (const text of chips) $("meta").append(Object.assign(document.createElement("span"), { textContent: text }));
    for (const note of META.notes) {
      const warn = /top \d+ keys|left out|unavailable/.test(note);
      $("notes").append(Object.assign(document.createElement("div"), { textContent: note, className: warn ? "warn" : "" }));
    }
    $("foot").textContent = "Written by lmforge · one self-contained file, works offline · ← → change layer";
  },

  controls() {
    for (const b of $("tabs").children) b.addEventListener("click", () => this.set({ view: b.dataset.view }));
    META.groups.forEach((G, g) => {
      const b = Object.assign(document.createElement("button"), { type: "button", textContent: G.name });
      b.dataset.g = g;
      b.addEventListener("click", () => this.set({ g, li: this.sameLayer(g) }));
      $("groups").append(b);
    });
    $("group-ctl").hidden = META.groups.length < 2;
    $("layer").addEventListener("change", (e) => this.set({ li: Number(e.target.value) }));
    $("layer-prev").addEventListener("click", () => this.set({ li: this.state.li - 1 }));
    $("layer-next").addEventListener("click", () => this.set({ li: this.state.li + 1 }));
    $("heads-all").addEventListener("click", () => this.set({ heads: new Set(this.allHeads()) }));
    $("heads-none").addEventListener("click", () => this.set({ heads: new Set() }));
    $("token").addEventListener("change", (e) => this.set({ token: Number(e.target.value) }));
    $("sort").addEventListener("change", (e) => this.set({ sort: e.target.checked }));
    document.addEventListener("keydown", (e) => {
      if (e.target.tagName === "SELECT" || e.target.tagName === "INPUT") return;
      if (e.key === "ArrowLeft" || e.key === "ArrowRight") this.set({ li: this.state.li + (e.key === "ArrowLeft" ? -1 : 1) });
    });
  },

  // the entry of group g with the model layer now shown, else its first
  sameLayer(g) {
    const li = META.groups[g].layers.indexOf(META.groups[this.state.g].layers[this.state.li]);
    return Math.max(0, li);
  },

  allHeads() {
    return [...Array(META.groups[this.state.g].heads[this.state.li]).keys()];
  },

  fromHash(p) {
    const s = { heads: null }, num = (key) => Number.parseInt(p.get(key), 10);
    if (VIEWS.includes(p.get("view"))) s.view = p.get("view");
    s.g = Math.max(0, META.groups.findIndex((G) => G.name === p.get("group")));
    const li = p.has("layer") ? META.groups[s.g].layers.indexOf(num("layer")) : 0;
    s.li = Math.max(0, li);
    if (p.has("heads") && p.get("heads") !== "all") s.heads = new Set(p.get("heads").split(",").filter(Boolean).map(Number));
    if (p.has("head")) s.head = num("head");
    if (p.has("token")) s.token = num("token");
    s.sort = p.has("sort");
    return s;
  },

  hash() {
    const s = this.state, G = META.groups[s.g], p = new URLSearchParams();
    p.set("view", s.view);
    p.set("group", G.name);
    p.set("layer", G.layers[s.li]);
    p.set("heads", s.heads.size === G.heads[s.li] ? "all" : [...s.heads].sort((a, b) => a - b).join(","));
    p.set("head", s.head);
    if (s.token >= 0) p.set("token", s.token);
    if (s.sort) p.set("sort", "");
    return p.toString().replace(/%2C/g, ",");
  },

  set(patch) {
    Object.assign(this.state, patch);
    const s = this.state, G = META.groups[s.g];
    s.li = Math.max(0, Math.min(G.layers.length - 1, s.li || 0));
    const H = G.heads[s.li];
    s.heads = s.heads === null ? new Set(this.allHeads()) : new Set([...s.heads].filter((h) => h >= 0 && h < H));
    s.head = Math.max(0, Math.min(H - 1, Number.isFinite(s.head) ? s.head : 0));
    s.token = Number.isFinite(s.token) && s.token < G.rows.length ? Math.max(-1, s.token) : -1;
    try {
      history.replaceState(null, "", `#${this.hash()}`);
    } catch (e) { /* some browsers refuse history on file:// pages; the hash is a convenience */ }
    this.render();
  },

  render() {
    const s = this.state;
    for (const v of VIEWS) $(`view-${v}`).classList.toggle("on", v === s.view);
    for (const b of $("tabs").children) b.classList.toggle("on", b.dataset.view === s.view);
    for (const b of $("groups").children) b.classList.toggle("on", Number(b.dataset.g) === s.g);
    this.layerOptions();
    this.chips();
    this.tokenOptions();
    if (s.view === "head") HeadView.draw(s);
    else if (s.view === "model") ModelView.draw(s);
    else NeuronView.draw(s);
    if (this.check) document.body.dataset.checksum = this.checksum();
  },

  layerOptions() {
    const G = META.groups[this.state.g], sel = $("layer");
    if (sel.dataset.g !== String(this.state.g)) {
      sel.textContent = "";
      // the model's own layer number: "1 / 1" (this layer of the recorded ones) read as "the only layer"
      G.layers.forEach((layer, li) => sel.append(new Option(String(layer), li)));
      sel.dataset.g = this.state.g;
    }
    sel.value = this.state.li;
    $("layer-prev").disabled = this.state.li === 0;
    $("layer-next").disabled = this.state.li === G.layers.length - 1;
  },

  // one chip per head; in the neuron view they pick the one head, elsewhere they toggle heads
  chips() {
    const s = this.state, H = META.groups[s.g].heads[s.li], box = $("heads"), single = s.view === "neuron";
    $("heads-ctl").style.visibility = s.view === "model" ? "hidden" : "visible";
    $("heads-all").hidden = $("heads-none").hidden = single;
    if (box.children.length !== H) {
      box.textContent = "";
      for (let h = 0; h < H; h++) {
        const b = Object.assign(document.createElement("button"), { type: "button", className: "chip", textContent: h });
        b.style.setProperty("--c", headColour(h));
        b.title = `head ${h}`;
        b.addEventListener("click", () => this.toggleHead(h));
        box.append(b);
      }
    }
    [...box.children].forEach((b, h) => b.classList.toggle("on", single ? h === s.head : s.heads.has(h)));
  },

  toggleHead(h) {
    if (this.state.view === "neuron") return this.set({ head: h });
    const heads = new Set(this.state.heads);
    if (heads.has(h)) heads.delete(h);
    else heads.add(h);
    this.set({ heads, head: h });
  },

  tokenOptions() {
    const G = META.groups[this.state.g], sel = $("token");
    if (sel.dataset.g !== String(this.state.g)) {
      sel.textContent = "";
      G.rows.forEach((t, i) => sel.append(new Option(`${i}: ${shortToken(t, 24)}`, i)));
      sel.dataset.g = this.state.g;
    }
    sel.value = Math.max(0, this.state.token);
    $("sort").checked = this.state.sort;
  },

  checksum() {
    const v = this.state.view;
    return checksum(v === "head" ? [$("head-canvas")] : v === "model" ? ModelView.canvases() : [$("neuron-canvas")]);
  },
};

App.init();
