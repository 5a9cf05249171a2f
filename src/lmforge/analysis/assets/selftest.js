"use strict";
/* #selftest: drives each control as a user would (clicks, selects, mouse over the head view) and
   writes, after each step, the state and a checksum of the drawn pixels into <pre id="selftest">,
   so a headless browser's --dump-dom shows whether every control changed what is drawn. */
function selftestSteps() {
  const tab = (v) => () => $("tabs").querySelector(`[data-view="${v}"]`).click();
  const pick = (sel, value) => () => {
    sel.value = value;
    sel.dispatchEvent(new Event("change"));
  };
  const chip = (which) => () => $("heads").children[which === "last" ? $("heads").children.length - 1 : which].click();
  const thumb = () => {
    const h = Math.min(1, META.groups[App.state.g].heads[0] - 1);
    $("model-grid").querySelector(`canvas[data-li='0'][data-h='${h}']`).click();
  };
  return [
    ["start", tab("head")],
    ["hover", () => mouse("mousemove", 1)],
    ["pin", () => mouse("click", 1)],
    ["unpin", () => { mouse("click", 1); mouse("mouseleave", 1); }],
    ["layer", pick($("layer"), "1")],
    ["head-off", chip(0)],
    ["one-head", () => { $("heads-none").click(); chip("last")(); }],
    ["layer-prev", () => $("layer-prev").click()],
    ["scroll", () => { window.scrollTo(0, 1500); App.render(); }],
    ...(META.groups.length > 1 ? [["group", () => { window.scrollTo(0, 0); $("groups").lastElementChild.click(); }]] : []),
    ["model", tab("model")],
    ["thumbnail", thumb],
    ["neuron", tab("neuron")],
    ["token", pick($("token"), String($("token").options.length - 1))],
    ["neuron-head", chip(0)],
  ];
}

// a mouse event over query token i of the head view
function mouse(type, i) {
  const c = $("head-canvas"), r = c.getBoundingClientRect(), g = HeadView.geo;
  const y = r.top + g.top + (i + 0.5) * g.rowH - HeadView.band.off;
  c.dispatchEvent(new MouseEvent(type, { clientX: r.left + g.x0 - 20, clientY: y }));
}

function selftest() {
  const steps = [];
  let last = performance.now();
  for (const [action, act] of selftestSteps()) {
    try {
      act();
    } catch (e) {
      App.errors.push(`${action}: ${e.message}`);
    }
    const s = App.state, G = META.groups[s.g];
    steps.push({ action, ms: Math.round(performance.now() - last), view: s.view, group: G.name,
      layer: G.layers[s.li], heads: [...s.heads].sort((a, b) => a - b), head: s.head, token: s.token,
      band: HeadView.band.off, checksum: App.checksum() });
    last = performance.now();
  }
  const out = $("selftest");
  out.textContent = JSON.stringify({ steps, errors: App.errors });
  out.dataset.done = "1";
}
