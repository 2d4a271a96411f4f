// torchlens viewer: the pan and zoom that frame the graph. Pure functions of sizes, so they
// are tested outside a browser too (tests/test_viewer.py runs them with Node).
"use strict";
(function (root) {
  const MARGIN = 20; // pixels left free around a fitted graph
  const MIN_K = 0.02, MAX_K = 4; // the zoom's range (wheel and keys stay inside it)

  // The whole w x h graph inside a W x H window, centred: the smaller of the scale that fits
  // the width and the one that fits the height, never above 1:1. Only a graph more than 50
  // times taller (or wider) than the window hits the zoom's floor and overflows it.
  function whole(w, h, W, H) {
    const k = Math.max(MIN_K, Math.min(1, (W - 2 * MARGIN) / Math.max(w, 1), (H - 2 * MARGIN) / Math.max(h, 1)));
    return { x: (W - w * k) / 2, y: Math.max(MARGIN, (H - h * k) / 2), k };
  }

  // The first view: as wide as the window (at most 1:1) and the top of the graph at the top,
  // so the boxes stay readable and a tall graph is read by scrolling down.
  function top(w, h, W, H) {
    const k = Math.max(MIN_K, Math.min(1, (W - 2 * MARGIN) / Math.max(w, 1)));
    return { x: (W - w * k) / 2, y: MARGIN, k };
  }

  root.tlFit = { whole, top, MARGIN, MIN_K, MAX_K };
})(typeof window !== "undefined" ? window : globalThis);
