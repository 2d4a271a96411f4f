// torchlens viewer: lays out the unfolded part of the graph, draws what is on screen.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("tl-data").textContent);
  const NODES = DATA.nodes, GROUPS = DATA.groups, EDGES = DATA.edges;
  const G = GROUPS.length;
  const BUDGET = 150; // boxes shown at first: unfold level by level while it fits
  const GAP_Y = 26, GAP_X = 18, PAD = 10, TITLE = 20, CHAR = 6.4;
  const svg = document.getElementById("graph");
  const viewport = document.getElementById("viewport");
  const layers = { frames: byId("frames"), edges: byId("edges"), boxes: byId("boxes") };
  const RANK = { passed: 1, incomplete: 2, unverified: 3, failed: 4 };

  // ---- static structure: group ids are 1..G (0 is the whole graph) -------------------------
  const parentOf = new Int32Array(G + 1), depthOf = new Int32Array(G + 1);
  const firstOf = new Float64Array(G + 1).fill(Infinity);
  const kids = Array.from({ length: G + 1 }, () => []);
  const nodeKids = Array.from({ length: G + 1 }, () => []);
  GROUPS.forEach((g, j) => {
    parentOf[j + 1] = g.p + 1;
    depthOf[j + 1] = depthOf[g.p + 1] + 1;
    kids[g.p + 1].push(j + 1);
  });
  const verdictOf = new Int8Array(G + 1), hitsIn = new Int32Array(G + 1);
  const hintSum = new Float64Array(G + 1), hintCount = new Int32Array(G + 1);
  const byId_ = new Map();
  NODES.forEach((n, i) => {
    byId_.set(n.id, i);
    nodeKids[n.g + 1].push(i);
    for (let c = n.g + 1; c; c = parentOf[c]) {
      firstOf[c] = Math.min(firstOf[c], i);
      hintSum[c] += n.x || 0;
      hintCount[c]++;
      verdictOf[c] = Math.max(verdictOf[c], RANK[n.v] || 0);
    }
  });
  const expanded = new Uint8Array(G + 1);
  expanded[0] = 1;
  // rolled view: each layer once (later passes are drawn as their first, node.L)
  const hasFirst = new Uint8Array(G + 1); // the group holds a node the rolled view shows
  NODES.forEach((n) => { if (n.L === undefined) for (let c = n.g + 1; c; c = parentOf[c]) hasFirst[c] = 1; });
  let rolled = false, edgeLabel = new Map();
  function canon(i) { return rolled && NODES[i].L !== undefined ? NODES[i].L : i; }

  // ---- state -------------------------------------------------------------------------------
  let view = { x: 0, y: 0, k: 1 };
  let pos = new Map(); // item key ("n3", "g2") -> {x, y, w, h}
  let drawables = [], visEdges = [], paths = [], selected = -1, hits = [], hitAt = -1, hitSet = new Set();
  let queued = false, firstPaint = null;

  function byId(id) { return document.getElementById(id); }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  // ---- which box stands for a node: its outermost folded group, or itself ------------------
  function repOf(i) {
    i = canon(i);
    let rep = "n" + i;
    for (let c = NODES[i].g + 1; c; c = parentOf[c]) if (!expanded[c]) rep = "g" + c;
    return rep;
  }
  function containerOf(key) {
    const id = +key.slice(1);
    return key[0] === "n" ? NODES[id].g + 1 : parentOf[id];
  }
  function chainOf(c) { const out = []; for (; c; c = parentOf[c]) out.push(c); out.push(0); return out.reverse(); }

  // ---- layout ------------------------------------------------------------------------------
  function boxSize(key) {
    const id = +key.slice(1);
    if (key[0] === "n") {
      const n = NODES[id];
      const lines = [n.t, subLine(n), modLine(n)];
      const w = Math.max(...lines.map((s) => s.length)) * CHAR + 18;
      return { w: Math.max(w, 60), h: modLine(n) ? 44 : 32 };
    }
    const g = GROUPS[id - 1];
    const w = Math.max(g.t.length, groupSub(g).length) * CHAR + 22;
    return { w: Math.max(w, 80), h: 38 };
  }
  function modLine(n) { // a one-op module call is named inside its op
    if (!n.ms || !n.ms.length) return "";
    const inner = n.ms[n.ms.length - 1];
    const owner = n.g >= 0 ? GROUPS[n.g].id : "";
    return inner === owner ? "" : inner.replace(/:1$/, "") + (n.mt ? " (" + n.mt + ")" : "");
  }
  function subLine(n) { return (n.s || "") + (rolled && n.np ? "  ×" + n.np + " passes" : ""); }
  function groupSub(g) { return (g.r ? g.m + " ×" + g.r : g.m) + " · " + g.n + " ops"; }

  function layout() {
    const items = Array.from({ length: G + 1 }, () => []);
    const inner = Array.from({ length: G + 1 }, () => []);
    const shown = new Set();
    for (let c = 0; c <= G; c++) {
      if (!isShown(c)) continue;
      for (const i of nodeKids[c]) if (canon(i) === i) items[c].push("n" + i);
      for (const k of kids[c]) if (!rolled || hasFirst[k]) items[c].push("g" + k);
    }
    visEdges = [];
    const passPairs = new Map();
    for (const [a, b] of EDGES) {
      const ra = repOf(a), rb = repOf(b);
      if (rolled && NODES[a].P && NODES[b].P && NODES[a].P !== NODES[b].P && ra !== rb) {
        const pairs = passPairs.get(ra + ">" + rb) || [];
        pairs.push([NODES[a].P, NODES[b].P]);
        passPairs.set(ra + ">" + rb, pairs);
      }
      if (ra === rb || shown.has(ra + ">" + rb)) continue;
      shown.add(ra + ">" + rb);
      visEdges.push([ra, rb]);
      const ca = chainOf(containerOf(ra)), cb = chainOf(containerOf(rb));
      let d = 0;
      while (d + 1 < ca.length && d + 1 < cb.length && ca[d + 1] === cb[d + 1]) d++;
      const la = d + 1 < ca.length ? "g" + ca[d + 1] : ra;
      const lb = d + 1 < cb.length ? "g" + cb[d + 1] : rb;
      if (la !== lb) inner[ca[d]].push([la, lb]);
    }
    pos = new Map();
    const size = place(0, items, inner);
    pos.set("g0", { x: 0, y: 0, w: size.w, h: size.h });
    absolute(0, 0, 0, items);
    collect(items);
    paths = window.tlRoute(visEdges, pos, drawables.filter((key) => !isFrame(key)));
    edgeLabel = new Map();
    for (const [key, pairs] of passPairs) { // "1→2 … 19→20": the passes an edge connects
      pairs.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
      const text = pairs.map(([x, y]) => x + "→" + y);
      edgeLabel.set(key, text.length > 2 ? text[0] + " … " + text[text.length - 1] : text.join(", "));
    }
    paths = paths.map((e) => (pos.get(e.b).y < pos.get(e.a).y ? { ...e, ...backPath(pos.get(e.a), pos.get(e.b)) } : e));
  }
  // An edge back up to an earlier box (a value carried to the next pass): a loop on the right.
  function backPath(p, q) {
    const sx = p.x + p.w, sy = p.y + p.h / 2, tx = q.x + q.w, ty = q.y + q.h / 2, out = Math.max(sx, tx) + 40;
    return { d: `M${sx},${sy} C${out},${sy} ${out},${ty} ${tx + 4},${ty}`,
      box: { x: Math.min(sx, tx), y: ty, w: out - Math.min(sx, tx) + 1, h: sy - ty + 1 } };
  }
  function isShown(c) { for (; c; c = parentOf[c]) if (!expanded[c]) return false; return true; }
  function first(key) { const id = +key.slice(1); return key[0] === "n" ? id : firstOf[id]; }
  function hint(key) { // Graphviz's x, for a group the mean over the ops inside it
    const id = +key.slice(1);
    if (key[0] === "n") return NODES[id].x || 0;
    return hintCount[id] ? hintSum[id] / hintCount[id] : 0;
  }

  // Places the items of container c (relative positions), returns its size.
  function place(c, items, inner) {
    const list = items[c];
    for (const key of list) {
      const id = +key.slice(1);
      if (key[0] === "g" && expanded[id]) {
        const s = place(id, items, inner);
        const titleW = (GROUPS[id - 1].t.length + GROUPS[id - 1].m.length + 6) * CHAR;
        pos.set(key, { x: 0, y: 0, w: Math.max(s.w + 2 * PAD, titleW), h: s.h + 2 * PAD + TITLE, cw: s.w });
      } else pos.set(key, { x: 0, y: 0, ...boxSize(key) });
    }
    list.sort((a, b) => first(a) - first(b));
    const preds = new Map(list.map((k) => [k, []]));
    for (const [a, b] of inner[c]) if (preds.has(b) && preds.has(a)) preds.get(b).push(a);
    for (const key of list) { // downward only: an item sits below everything it reads
      const p = pos.get(key);
      for (const a of preds.get(key)) { const q = pos.get(a); p.y = Math.max(p.y, q.y + q.h + GAP_Y); }
    }
    const order = list.slice().sort((a, b) => pos.get(a).y - pos.get(b).y || hint(a) - hint(b));
    const active = [];
    let minX = Infinity, maxX = 0, maxY = 0;
    for (const key of order) {
      const p = pos.get(key), ps = preds.get(key);
      let want = 0;
      if (ps.length) want = ps.reduce((s, a) => s + pos.get(a).x + pos.get(a).w / 2, 0) / ps.length;
      for (let i = active.length - 1; i >= 0; i--) {
        const q = pos.get(active[i]);
        if (q.y + q.h + GAP_Y <= p.y) active.splice(i, 1);
      }
      const cx = freeSpot(want, p, active.map((k) => pos.get(k)));
      p.x = cx - p.w / 2;
      active.push(key);
      minX = Math.min(minX, p.x); maxX = Math.max(maxX, p.x + p.w); maxY = Math.max(maxY, p.y + p.h);
    }
    if (!list.length) return { w: 0, h: 0 };
    for (const key of list) pos.get(key).x -= minX;
    return { w: maxX - minX, h: maxY };
  }
  // The centre nearest `want` where a box of p.w fits between the boxes beside it.
  function freeSpot(want, p, others) {
    const busy = others.filter((q) => q.y < p.y + p.h + GAP_Y).map((q) => [q.x - GAP_X, q.x + q.w + GAP_X]);
    const fits = (cx) => busy.every(([l, r]) => cx + p.w / 2 <= l + 0.01 || cx - p.w / 2 >= r - 0.01);
    if (fits(want)) return want;
    let best = null;
    for (const [l, r] of busy) {
      for (const cx of [l - p.w / 2, r + p.w / 2]) {
        if (fits(cx) && (best === null || Math.abs(cx - want) < Math.abs(best - want))) best = cx;
      }
    }
    return best === null ? want : best;
  }
  function absolute(c, ox, oy, items) {
    for (const key of items[c]) {
      const p = pos.get(key);
      p.x += ox; p.y += oy;
      const id = +key.slice(1);
      if (key[0] === "g" && expanded[id]) absolute(id, p.x + (p.w - p.cw) / 2, p.y + PAD + TITLE, items);
    }
  }
  function collect(items) {
    drawables = [];
    for (let c = 0; c <= G; c++) {
      for (const key of items[c]) drawables.push(key);
    }
    drawables.sort((a, b) => (isFrame(a) ? 0 : 1) - (isFrame(b) ? 0 : 1) || depthKey(a) - depthKey(b));
  }
  function isFrame(key) { return key[0] === "g" && expanded[+key.slice(1)]; }
  function depthKey(key) { return key[0] === "g" ? depthOf[+key.slice(1)] : 0; }

  // ---- drawing: only what is on screen -----------------------------------------------------
  function schedule() { if (!queued) { queued = true; requestAnimationFrame(render); } }
  function render() {
    queued = false;
    viewport.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
    const W = svg.clientWidth, H = svg.clientHeight, m = 200 / view.k;
    const x0 = -view.x / view.k - m, y0 = -view.y / view.k - m;
    const x1 = x0 + W / view.k + 2 * m, y1 = y0 + H / view.k + 2 * m;
    const onScreen = (p) => p.x < x1 && p.x + p.w > x0 && p.y < y1 && p.y + p.h > y0;
    const frames = [], boxes = [], edges = [];
    for (const key of drawables) {
      const p = pos.get(key);
      if (!onScreen(p)) continue;
      if (isFrame(key)) frames.push(frameSvg(key, p)); else boxes.push(boxSvg(key, p));
    }
    const sel = selected >= 0 ? repOf(selected) : "";
    for (const e of paths) {
      if (!onScreen(e.box)) continue;
      const label = edgeLabel.get(e.a + ">" + e.b);
      const cls = (e.a === sel || e.b === sel ? "hot" : "") + (label ? " pass" : "");
      edges.push(`<path${cls.trim() ? ` class="${cls.trim()}"` : ""} d="${e.d}" marker-end="url(#arrow)"/>`);
      if (label) edges.push(`<text class="pass" x="${e.box.x + e.box.w + 3}" y="${e.box.y + e.box.h / 2}">${esc(label)}</text>`);
    }
    // hidden edges (dependencies through Python values, found by validation): dashed, from
    // the box standing for the escaped record to the one standing for the op it reaches
    for (const [a, b] of DATA.hidden || []) {
      const pa = pos.get(repOf(a)), pb = pos.get(repOf(b));
      if (!pa || !pb || pa === pb || !(onScreen(pa) || onScreen(pb))) continue;
      const ax = pa.x + pa.w / 2, ay = pa.y + pa.h, bx = pb.x + pb.w / 2, by = pb.y;
      edges.push(`<path class="hidden-edge" d="M${ax},${ay}L${bx},${by}" marker-end="url(#arrow)"/>`);
    }
    layers.frames.innerHTML = frames.join("");
    layers.edges.innerHTML = edges.join("");
    layers.boxes.innerHTML = boxes.join("");
    if (firstPaint === null) {
      requestAnimationFrame(() => {
        firstPaint = performance.now();
        document.body.dataset.ready = "1";
        window.tlViewer.firstPaint = firstPaint;
      });
    }
  }
  function frameSvg(key, p) {
    const id = +key.slice(1), g = GROUPS[id - 1];
    const cls = `frame d${(depthOf[id] - 1) % 4}${g.r ? " run" : ""}`;
    const title = `▾ ${g.t} (${g.m}${g.r ? " ×" + g.r : ""})`;
    return `<g class="${cls}" data-g="${id}"><rect x="${p.x}" y="${p.y}" width="${p.w}" height="${p.h}" rx="6"/>` +
      `<text class="t" x="${p.x + 8}" y="${p.y + 15}">${esc(title)}</text></g>`;
  }
  function boxSvg(key, p) {
    const id = +key.slice(1);
    let cls = "box", lines, data;
    if (key[0] === "g") {
      const g = GROUPS[id - 1];
      cls += " group" + (g.r ? " run" : "") + verdictClass(verdictOf[id]) + (hitsIn[id] ? " hit" : "");
      lines = [`<text x="${p.x + 9}" y="${p.y + 15}"><tspan font-weight="bold">▸ ${esc(g.t)}</tspan></text>`,
        `<text class="sub${g.r ? " cnt" : ""}" x="${p.x + 9}" y="${p.y + 30}">${esc(groupSub(g))}</text>`];
      data = `data-g="${id}"`;
    } else {
      const n = NODES[id];
      cls += " " + n.k + (n.w && n.w.length ? " weighted" : "") + (n.ip ? " inplace" : "");
      cls += (n.v ? " v-" + n.v : "") + (hitSet.has(id) ? " hit" : "") + (id === selected ? " sel" : "");
      cls += n.esc ? " escapes" : "";
      cls += rolled && n.np ? " passes" : "";
      lines = [`<text x="${p.x + 9}" y="${p.y + 14}" font-weight="bold">${esc(n.t)}</text>`,
        `<text class="sub" x="${p.x + 9}" y="${p.y + 27}">${esc(subLine(n))}</text>`];
      const mod = modLine(n);
      if (mod) lines.push(`<text class="mod" x="${p.x + 9}" y="${p.y + 39}">${esc(mod)}</text>`);
      if (n.esc) lines.push(`<text class="esc-mark" x="${p.x + p.w - 6}" y="${p.y + 13}" text-anchor="end">⇢py</text>`);
      data = `data-n="${id}"`;
    }
    return `<g class="${cls}" ${data}><rect x="${p.x}" y="${p.y}" width="${p.w}" height="${p.h}" rx="5"/>${lines.join("")}</g>`;
  }
  function verdictClass(rank) { return rank ? " v-" + ["", "passed", "incomplete", "unverified", "failed"][rank] : ""; }

  // ---- folding, moving, finding ------------------------------------------------------------
  function relayout() { layout(); schedule(); }
  function toggle(id, open) {
    const x = pos.get("g" + id);
    const before = x ? { x: x.x, y: x.y } : null;
    expanded[id] = open ? 1 : 0;
    layout();
    const after = pos.get("g" + id);
    if (before && after) { view.x += (before.x - after.x) * view.k; view.y += (before.y - after.y) * view.k; }
    schedule();
  }
  function reveal(i) { for (let c = NODES[i].g + 1; c; c = parentOf[c]) expanded[c] = 1; }
  function centre(key) {
    const p = pos.get(key);
    if (!p) return;
    const panel = byId("panel").hidden ? 0 : byId("panel").offsetWidth;
    view.x = (svg.clientWidth - panel) / 2 - (p.x + p.w / 2) * view.k;
    view.y = svg.clientHeight / 2 - (p.y + p.h / 2) * view.k;
    schedule();
  }
  // "Fit" (and the 0 key): the whole graph in the window, both ways; `how` = tlFit.top for
  // the first view, full width from the top.
  function fit(how) {
    const root = pos.get("g0");
    view = (typeof how === "function" ? how : window.tlFit.whole)(root.w, root.h, svg.clientWidth, svg.clientHeight);
    schedule();
  }
  function zoom(f, cx, cy) {
    const k = Math.min(window.tlFit.MAX_K, Math.max(window.tlFit.MIN_K, view.k * f));
    view.x = cx - (cx - view.x) * (k / view.k);
    view.y = cy - (cy - view.y) * (k / view.k);
    view.k = k;
    schedule();
  }
  function select(i, move) {
    selected = i;
    if (i < 0) { byId("panel").hidden = true; schedule(); return; }
    reveal(i);
    layout();
    byId("panel").hidden = false;
    byId("detail").innerHTML = window.tlViewerPanel(NODES[i], NODES, byId_);
    if (move) centre(repOf(i)); else schedule();
  }
  function search(text, step) {
    const q = text.trim().toLowerCase();
    if (!step) {
      hits = [];
      hitsIn.fill(0);
      if (q) {
        NODES.forEach((n, i) => {
          const hay = [n.t, n.f || "", ...(n.ms || [])].join(" ").toLowerCase();
          if (hay.includes(q)) hits.push(i);
        });
        const rank = (i) => (NODES[i].t.toLowerCase() === q ? 0 : 1); // an exact label first
        hits.sort((a, b) => rank(a) - rank(b) || a - b);
      }
      hitSet = new Set(hits);
      for (const i of hits) for (let c = NODES[i].g + 1; c; c = parentOf[c]) hitsIn[c]++;
      hitAt = -1;
    }
    byId("hits").textContent = q ? (hits.length ? "" : "no match") : "";
    if (!hits.length) { schedule(); return; }
    hitAt = (hitAt + 1) % hits.length;
    reveal(hits[hitAt]);
    layout();
    centre(repOf(hits[hitAt]));
    byId("hits").textContent = `${hitAt + 1} / ${hits.length}`;
  }
  function initialFolds() {
    let count = nodeKids[0].length + kids[0].length;
    let level = kids[0].slice();
    while (level.length) {
      const grown = count - level.length + level.reduce((s, g) => s + nodeKids[g].length + kids[g].length, 0);
      if (grown > BUDGET) break;
      count = grown;
      const next = [];
      for (const g of level) { expanded[g] = 1; next.push(...kids[g]); }
      level = next;
    }
  }

  // ---- events ------------------------------------------------------------------------------
  let drag = null;
  svg.addEventListener("pointerdown", (e) => {
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false };
  });
  window.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    drag.moved = true;
    svg.classList.add("dragging");
    view.x = drag.vx + dx; view.y = drag.vy + dy;
    schedule();
  });
  window.addEventListener("pointerup", () => { svg.classList.remove("dragging"); setTimeout(() => { drag = null; }, 0); });
  svg.addEventListener("click", (e) => {
    if (drag && drag.moved) return;
    const node = e.target.closest("[data-n]"), group = e.target.closest("[data-g]");
    if (node) select(+node.dataset.n, false);
    else if (group) toggle(+group.dataset.g, group.classList.contains("box"));
  });
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = svg.getBoundingClientRect();
    zoom(Math.exp(-e.deltaY * 0.0015), e.clientX - r.left, e.clientY - r.top);
  }, { passive: false });
  window.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") {
      if (e.key === "Enter") search(e.target.value, true);
      if (e.key === "Escape") e.target.blur();
      return;
    }
    const W = svg.clientWidth / 2, H = svg.clientHeight / 2, step = 80;
    const moves = { ArrowLeft: [step, 0], ArrowRight: [-step, 0], ArrowUp: [0, step], ArrowDown: [0, -step] };
    if (moves[e.key]) { view.x += moves[e.key][0]; view.y += moves[e.key][1]; schedule(); }
    else if (e.key === "+" || e.key === "=") zoom(1.25, W, H);
    else if (e.key === "-" || e.key === "_") zoom(0.8, W, H);
    else if (e.key === "0") fit();
    else if (e.key === "/") { e.preventDefault(); byId("search").focus(); }
    else if (e.key === "Escape") select(-1);
    else return;
    e.preventDefault();
  });
  let typing = null;
  byId("search").addEventListener("input", (e) => {
    clearTimeout(typing);
    typing = setTimeout(() => search(e.target.value, false), 150);
  });
  byId("close").addEventListener("click", () => select(-1));
  byId("fit").addEventListener("click", () => fit());
  function roll(on) {
    rolled = on;
    const button = byId("roll");
    button.textContent = on ? "Unrolled" : "Rolled";
    button.setAttribute("aria-pressed", on ? "true" : "false");
    relayout();
    fit();
  }
  byId("roll").addEventListener("click", () => roll(!rolled));
  byId("fold").addEventListener("click", () => { expanded.fill(0); expanded[0] = 1; relayout(); fit(); });
  byId("detail").addEventListener("click", (e) => {
    const link = e.target.closest("[data-goto]");
    if (link) { e.preventDefault(); select(+link.dataset.goto, true); }
  });
  window.addEventListener("resize", schedule);

  // ---- start -------------------------------------------------------------------------------
  window.tlViewer = { expanded, toggle, select, search, fit, roll, rolled: () => rolled, groups: GROUPS, nodes: NODES, view: () => view,
    boxes: () => Object.fromEntries(pos), firstPaint: null };
  byId("title").textContent = DATA.title;
  byId("info").textContent = `${DATA.ops} ops · ${G} groups · layout: ${DATA.layout === "graphviz" ? "Graphviz order" : "in page"}`;
  document.title = DATA.title + " - torchlens";
  svg.insertAdjacentHTML("afterbegin", '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" markerUnits="userSpaceOnUse" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#5c6678"/></marker></defs>');
  window.tlViewerLegend(DATA, NODES, byId("legend"));
  byId("roll").hidden = !DATA.repeated;
  initialFolds();
  if (DATA.start_rolled && DATA.repeated) roll(true);
  layout();
  fit(window.tlFit.top);
})();
