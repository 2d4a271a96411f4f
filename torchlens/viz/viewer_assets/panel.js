// torchlens viewer: the side panel of one op, and the legend of a validation overlay.
"use strict";
(function () {
  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }
  function row(name, value) { return `<tr><td>${esc(name)}</td><td>${value}</td></tr>`; }
  function links(labels, byId) {
    if (!labels || !labels.length) return "-";
    return labels.map((l) => (byId.has(l) ? `<a data-goto="${byId.get(l)}">${esc(l)}</a>` : esc(l))).join(", ");
  }
  function histogram(counts, lo, hi) {
    const W = 340, H = 70, max = Math.max(...counts, 1), bw = W / counts.length;
    const bars = counts.map((c, i) => {
      const h = (c / max) * (H - 4);
      return `<rect x="${(i * bw + 1).toFixed(1)}" y="${(H - h).toFixed(1)}" width="${(bw - 2).toFixed(1)}" height="${h.toFixed(1)}" fill="#4a6fa5"><title>${c}</title></rect>`;
    });
    return `<svg class="hist" width="${W}" height="${H + 14}" viewBox="0 0 ${W} ${H + 14}">${bars.join("")}` +
      `<text x="0" y="${H + 12}" font-size="10" fill="#5b6272">${esc(lo)}</text>` +
      `<text x="${W}" y="${H + 12}" font-size="10" fill="#5b6272" text-anchor="end">${esc(hi)}</text></svg>`;
  }
  function stats(st) {
    if (!st) return "<h3>Value</h3><p>not saved (trace with values saved to see statistics)</p>";
    let html = "<h3>Value</h3><table>";
    for (const k of ["min", "max", "mean", "std"]) if (k in st) html += row(k, esc(st[k]));
    html += row("zeros", esc((100 * st.zeros).toFixed(1) + " %"));
    html += row("NaN / Inf", esc(st.nan + " / " + st.inf));
    html += "</table>";
    if (st.hist) html += histogram(st.hist, st.min, st.max);
    if (st.vals) html += `<h3>First ${st.vals.length} values</h3><code>${esc(st.vals.join(", "))}</code>`;
    return html;
  }
  window.tlViewerPanel = function (n, nodes, byId) {
    let html = `<h2>${esc(n.t)}</h2>`;
    if (n.v) html += `<p class="verdict-${n.v}">validation: ${esc(n.v)}</p>`;
    if (n.why) html += `<ul>${n.why.map((r) => `<li>${esc(r)}</li>`).join("")}</ul>`;
    html += "<table>";
    if (n.k === "input") {
      html += row("kind", "input") + row("from", esc(n.path)) + row("shape", `<code>${esc(n.s)}</code>`) + row("dtype", esc(n.dt));
      return html + "</table>";
    }
    if (n.k === "output") return html + row("returns", links([n.s], byId)) + "</table>";
    html += row("function", `<code>${esc(n.f)}</code>`);
    html += row("module stack", n.ms.length ? n.ms.map(esc).join(" › ") : "(root)");
    if (n.mt) html += row("module type", esc(n.mt));
    html += row("shape", `<code class="shape">${esc(n.s)}</code>`) + row("dtype", esc(n.dt)) + row("device", esc(n.dev));
    if (n.ip) html += row("in-place", "yes");
    if (n.lp) html += row("layer:pass", esc(n.lp));
    html += row("call", `<code>${esc(n.a)}</code>`);
    html += row("parents", links(n.par, byId)) + row("children", links(n.ch, byId));
    if (n.w && n.w.length) html += row("parameters, buffers", esc(n.w.join(", ")));
    if (n.esc) html += row("read by Python (escapes)", n.esc.map(esc).join("<br>"));
    if (n.hp) html += row("hidden parents (through escapes)", links(n.hp, byId));
    return html + "</table>" + stats(n.st);
  };
  window.tlViewerLegend = function (data, nodes, el) {
    if (!data.status) return;
    // the counts are status.verdicts counted (made by Python), never recounted here
    const counts = data.counts || {};
    const colours = { passed: "#2e9e4f", incomplete: "#7a4fd0", failed: "#d0312d", unverified: "#d99a00" };
    let html = `validation: <b>${esc(data.status)}</b>` + Object.keys(colours).filter((k) => k in counts).map(
      (k) => `<i style="background:${colours[k]}"></i>${k} ${counts[k]}`).join("");
    if (data.hidden && data.hidden.length) html += `<i class="dash"></i>hidden edges ${data.hidden.length}`;
    el.innerHTML = html;
    el.hidden = false;
  };
})();
