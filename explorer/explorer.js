// The explorer page: reads the controls, asks attn's C++ (attn_explorer.wasm, explorer_api.cpp) for
// every figure and writes what it answers into the page. No figure is computed here: this file only
// formats (digits, thousands separators) and draws.
"use strict";

const $ = (id) => document.getElementById(id);
let api = null;  // the C entry points, bound by ccall once the module is ready

function call(name, ...args) {
  const r = JSON.parse(api.ccall(name, "string", args.map(() => "number"), args));
  if (r.error) throw new Error(r.error);
  return r;
}

// ---- sliders over a list of values ---------------------------------------------------------------

const commas = (n) => Number(n).toLocaleString("en-US");
const sliders = {};

function setupSlider(id) {
  const el = $(id);
  const values = el.dataset.values.split(",").map(Number);
  el.min = 0;
  el.max = values.length - 1;
  el.step = 1;
  el.value = Math.max(0, values.indexOf(Number(el.dataset.default)));
  const unit = el.dataset.unit ? " " + el.dataset.unit : "";
  const show = () => ($(id + "-out").textContent = commas(values[el.value]) + unit);
  el.addEventListener("input", show);
  el.setAttribute("aria-valuetext", "");
  el.addEventListener("input", () => el.setAttribute("aria-valuetext", $(id + "-out").textContent));
  sliders[id] = { el, values, value: () => values[el.value] };
  show();
}

// ---- the traffic panel ---------------------------------------------------------------------------

function trafficInputs() {
  return {
    seq: sliders.seq.value(),
    d: sliders.d.value(),
    sram: sliders.sram.value() * 1024,  // "192 KB" as the paper and `attn io --sram 192KB` mean it
    elem: Number($("elem").value),
    bw: Number($("bw").value) * 1e12,
    derate: Number($("derate").value),
  };
}

function showError(where, e) {
  $(where).textContent = "—";
  $("status").textContent = e.message;
}

function updateTraffic() {
  const p = trafficInputs();
  let r;
  try {
    r = call("explorer_io", p.seq, p.d, p.sram, p.elem, p.bw, p.derate);
  } catch (e) {
    return showError("std-bytes", e);
  }
  $("status").textContent = "";
  $("std-bytes").textContent = r.standard.text_bytes;
  $("std-time").textContent = r.standard.text_time;
  $("tiled-bytes").textContent = r.tiled.text_bytes;
  $("tiled-time").textContent = r.tiled.text_time;
  $("fa2-bytes").textContent = r.fa2.text_bytes;
  $("fa2-time").textContent = r.fa2.text_time;
  $("reduction").textContent = r.text_reduction;
  $("nxn").textContent = r.text_score_matrix;
  $("be-tiled").textContent = r.break_even_tiled.text;
  $("be-fa2").textContent = r.break_even_fa2.text;
  $("be-tiled").dataset.elements = r.break_even_tiled.elements;  // for the test, which checks the step
  $("be-fa2").dataset.elements = r.break_even_fa2.elements;
  $("tiles").textContent =
    `M = ${commas(r.sram_elements)} elements: Algorithm 1 B_c = ${r.tiled.block_cols}, ` +
    `B_r = ${r.tiled.block_rows}, T_c = ${r.tiled.passes} passes; FA2 order B = ${r.fa2.block_cols}, ` +
    `T_r = ${r.fa2.passes} query tiles.`;
  $("count-out").textContent = "";
  drawPlot(p, r);
  updateDecode();
}

// ---- the plot (SVG, log-log) ---------------------------------------------------------------------

const SWEEPS = {  // the swept range of each parameter, and how its ticks read
  0: { from: 128, to: 131072, label: "sequence N", tick: (x) => commas(x) },
  1: { from: 16, to: 512, label: "head dim d", tick: (x) => String(x) },
  2: { from: 1024, to: 1048576, label: "SRAM", tick: (x) => (x >= 1048576 ? x / 1048576 + " MiB" : x / 1024 + " KiB") },
};
const SERIES = [
  { name: "standard", cls: "s-std" },
  { name: "tiled (Alg. 1)", cls: "s-tiled" },
  { name: "FA2 order", cls: "s-fa2" },
];

function svg(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function siBytes(b) {
  const u = ["B", "kB", "MB", "GB", "TB", "PB"];
  let i = 0;
  while (b >= 999.5 && i < 5) (b /= 1000), i++;
  return `${+b.toPrecision(3)} ${u[i]}`;
}

function drawPlot(p, r) {
  const v = Number($("sweep").value), s = SWEEPS[v];
  const pts = call("explorer_sweep", v, s.from, s.to, 64, p.seq, p.d, p.sram, p.elem, p.bw, p.derate).points;
  const x0 = [p.seq, p.d, p.sram][v];
  const cur = [r.standard.bytes, r.tiled.bytes, r.fa2.bytes];
  const W = 640, H = 360, L = 64, R = 16, T = 16, B = 44;
  const ys = pts.flatMap((q) => q.slice(1)).concat(cur);
  const ly0 = Math.floor(Math.log10(Math.min(...ys))), ly1 = Math.ceil(Math.log10(Math.max(...ys)));
  const lx0 = Math.log2(s.from), lx1 = Math.log2(s.to);
  const X = (x) => L + ((Math.log2(x) - lx0) / (lx1 - lx0)) * (W - L - R);
  const Y = (y) => H - B - ((Math.log10(y) - ly0) / Math.max(1, ly1 - ly0)) * (H - T - B);
  const plot = $("plot");
  plot.replaceChildren();
  for (let e = ly0; e <= ly1; e++) {
    plot.append(svg("line", { x1: L, x2: W - R, y1: Y(10 ** e), y2: Y(10 ** e), class: "grid" }));
    plot.append(svg("text", { x: L - 6, y: Y(10 ** e) + 4, "text-anchor": "end" }, siBytes(10 ** e)));
  }
  for (let e = Math.ceil(lx0); e <= lx1; e += lx1 - lx0 > 12 ? 2 : 1) {
    plot.append(svg("line", { x1: X(2 ** e), x2: X(2 ** e), y1: T, y2: H - B, class: "grid" }));
    plot.append(svg("text", { x: X(2 ** e), y: H - B + 16, "text-anchor": "middle" }, s.tick(2 ** e)));
  }
  plot.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, s.label));
  SERIES.forEach((ser, k) => {
    const d = pts.map((q, i) => `${i ? "L" : "M"}${X(q[0]).toFixed(1)},${Y(q[k + 1]).toFixed(1)}`).join("");
    plot.append(svg("path", { d, class: "curve " + ser.cls }));
    plot.append(svg("text", { x: L + 10 + k * 150, y: T + 14, class: ser.cls + " legend" }, "— " + ser.name));
    if (x0 >= s.from && x0 <= s.to)
      plot.append(svg("circle", { cx: X(x0), cy: Y(cur[k]), r: 5, class: "mark " + ser.cls }));
  });
}

// ---- counted schedules ---------------------------------------------------------------------------

function runCount() {
  const p = trafficInputs();
  $("count-out").textContent = "Counting…";
  // Let the page paint "Counting…" before the (synchronous) simulation runs.
  setTimeout(() => {
    try {
      const c = call("explorer_count", p.seq, p.d, p.sram, p.elem);
      const line = (name, t) =>
        `${name}: ${commas(t.counted_elements)} elements counted ${t.counted_elements === t.closed_form ? "=" : "≠"} ` +
        `${commas(t.closed_form)} closed form, SRAM peak ${commas(t.sram_peak_elements)}, ` +
        `max |Δ| vs reference ${t.max_abs_diff.toExponential(1)}`;
      $("count-out").innerHTML = "";
      $("count-out").append(line("Algorithm 1", c.tiled), document.createElement("br"), line("FA2 order", c.fa2));
      $("count-out").dataset.tiled = c.tiled.counted_elements;
      $("count-out").dataset.fa2 = c.fa2.counted_elements;
    } catch (e) {
      showError("count-out", e);
    }
  }, 0);
}

// ---- tiled and split-K checks --------------------------------------------------------------------

const TILED = { seq: 48, d: 16, seed: 1 };  // `attn check tiled`'s defaults
const SPLITK = { keys: 4096, d: 16, seed: 1 };  // `attn check splitk`'s defaults

function updateTiled() {
  const t = sliders.tile.value();
  try {
    const r = call("explorer_tiled", TILED.seq, TILED.d, t, TILED.seed);
    $("tiled-check").textContent =
      `${TILED.seq} queries × ${TILED.seq} keys, d = ${TILED.d}, tiles of ${t}: tiled vs textbook, ` +
      `max |Δ| = ${r.max_abs_diff.toExponential(1)} ${r.passed ? "(exact)" : "FAIL"}`;
  } catch (e) {
    showError("tiled-check", e);
  }
}

function updateSplitK() {
  const w = sliders.workers.value();
  try {
    const r = call("explorer_splitk", SPLITK.keys, w, SPLITK.d, SPLITK.seed);
    $("splitk-check").textContent =
      `One query over ${commas(SPLITK.keys)} keys, merged from ${commas(w)} partials: ` +
      `max |Δ| = ${r.max_abs_diff.toExponential(1)} ${r.passed ? "(exact)" : "FAIL"}`;
    $("partials").replaceChildren(
      ...r.partials.map((q, i) => {
        const li = document.createElement("li");
        li.textContent = q.m === null ? `#${i}: empty slice (m=-inf l=0)`
                                      : `#${i}: m=${q.m.toFixed(2)} l=${q.l.toFixed(1)} (${commas(q.keys)} keys)`;
        return li;
      }));
    $("merged").textContent = `Merged: m=${r.merged.m.toFixed(2)} l=${r.merged.l.toFixed(1)}`;
  } catch (e) {
    showError("splitk-check", e);
  }
}

// ---- decode --------------------------------------------------------------------------------------

function decodeInputs() {
  return {
    cache: sliders.cache.value(), heads: sliders.heads.value(), kv: sliders.kvheads.value(),
    d: sliders.dhead.value(), elem: Number($("dec-elem").value), bw: Number($("dec-bw").value) * 1e12,
    derate: Number($("derate").value),
  };
}

function updateDecode() {
  const p = decodeInputs();
  try {
    const r = call("explorer_decode", p.cache, p.heads, p.kv, p.d, p.elem, p.bw, p.derate);
    $("decode-out").textContent =
      `Each new token reads ${r.text_read} per layer (K and V: ${(r.kv_bytes / 1e6).toFixed(1)} MB), ` +
      `${r.text_time} at ${$("dec-bw").value} TB/s × ${p.derate}.`;
  } catch (e) {
    showError("decode-out", e);
  }
}

// ---- wiring, and the test's drive mode -----------------------------------------------------------

function figures() {
  const ids = ["seq-out", "d-out", "sram-out", "std-bytes", "std-time", "tiled-bytes", "tiled-time", "fa2-bytes",
               "fa2-time", "reduction", "nxn", "be-tiled", "be-fa2", "tile-out", "tiled-check", "workers-out",
               "splitk-check", "merged", "cache-out", "heads-out", "kvheads-out", "dhead-out", "decode-out",
               "count-out"];
  const f = {};
  for (const id of ids) f[id] = $(id).textContent;
  f.partials = [...$("partials").children].map((li) => li.textContent);
  f.break_even_elements = [Number($("be-tiled").dataset.elements), Number($("be-fa2").dataset.elements)];
  // Fits the window: nothing wider than the viewport, at whatever width the test opens it.
  f.layout = { scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth };
  return f;
}

// #drive: moves every slider through each of its positions, as a user's input events would, and logs
// the inputs and the shown figures after each move into #drive-log (JSON lines) for tests/explorer.
function drive() {
  const log = [];
  // Keyboard: every control takes the focus (Tab reaches it; arrows then move a slider natively).
  const unfocusable = [...document.querySelectorAll("input, select, button")]
                          .filter((el) => (el.focus(), document.activeElement !== el))
                          .map((el) => el.id);
  log.push({ moved: "focus", unfocusable, controls: document.querySelectorAll("input, select, button").length });
  const record = (what) => log.push({ moved: what, traffic: trafficInputs(), decode: decodeInputs(), shown: figures() });
  for (const [id, s] of Object.entries(sliders)) {
    const start = s.el.value;
    for (let i = 0; i < s.values.length; i++) {
      s.el.value = i;
      s.el.dispatchEvent(new Event("input", { bubbles: true }));
      record(id);
    }
    s.el.value = start;
    s.el.dispatchEvent(new Event("input", { bubbles: true }));
  }
  $("derate").value = "0.5";
  $("derate").dispatchEvent(new Event("input", { bubbles: true }));
  record("derate");
  $("derate").value = "0.8";
  $("derate").dispatchEvent(new Event("input", { bubbles: true }));
  $("elem").value = "4";
  $("elem").dispatchEvent(new Event("change", { bubbles: true }));
  record("elem");
  $("elem").value = "2";
  $("elem").dispatchEvent(new Event("change", { bubbles: true }));
  sliders.seq.el.value = sliders.seq.values.indexOf(512);  // a count that takes well under a second
  sliders.seq.el.dispatchEvent(new Event("input", { bubbles: true }));
  // The button's own path: runCount defers the simulation by one task, so read its text one task later.
  $("count").click();
  setTimeout(() => {
    log.push({ moved: "count", traffic: trafficInputs(), shown: { "count-out": $("count-out").textContent } });
    $("drive-log").textContent = log.map((x) => JSON.stringify(x)).join("\n");
    $("drive-log").dataset.done = "1";
  }, 0);
}

function start(module) {
  api = module;
  for (const el of document.querySelectorAll("input[type=range]")) setupSlider(el.id);
  for (const id of ["seq", "d", "sram", "bw", "derate"]) $(id).addEventListener("input", updateTraffic);
  for (const id of ["elem", "sweep"]) $(id).addEventListener("change", updateTraffic);
  for (const id of ["cache", "heads", "kvheads", "dhead", "dec-bw"]) $(id).addEventListener("input", updateDecode);
  $("dec-elem").addEventListener("change", updateDecode);
  $("tile").addEventListener("input", updateTiled);
  $("workers").addEventListener("input", updateSplitK);
  $("count").addEventListener("click", runCount);
  updateTraffic();
  updateTiled();
  updateSplitK();
  $("status").textContent = "";
  if (location.hash === "#drive") drive();
}

createAttnModule().then(start, (e) => ($("status").textContent = "Could not load the WebAssembly module: " + e));
