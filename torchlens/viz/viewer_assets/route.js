// torchlens viewer: edge paths. An edge whose straight course would cross other boxes runs
// down a lane beside them instead, so it never looks as if it entered a box it skips.
"use strict";
(function () {
  const BEND = 12, MARGIN = 6, TALLEST = 60;

  // Boxes (not frames) sorted by top edge, for range scans.
  function obstaclesOf(keys, pos) {
    const list = keys.map((key) => ({ key, p: pos.get(key) }));
    list.sort((a, b) => a.p.y - b.p.y);
    return { list, ys: list.map((o) => o.p.y) };
  }
  function lowerBound(ys, y) {
    let lo = 0, hi = ys.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (ys[mid] < y) lo = mid + 1; else hi = mid; }
    return lo;
  }
  // The right edge of the boxes between heights sy..ty that overlap columns x0..x1, or null.
  function blocker(obst, a, b, sy, ty, x0, x1) {
    let right = null;
    for (let i = lowerBound(obst.ys, sy - TALLEST); i < obst.list.length; i++) {
      const o = obst.list[i], p = o.p;
      if (p.y >= ty) break;
      if (o.key === a || o.key === b || p.y + p.h <= sy) continue;
      if (p.x < x1 + MARGIN && p.x + p.w > x0 - MARGIN) right = Math.max(right ?? -Infinity, p.x + p.w);
    }
    return right;
  }
  function route(obst, pos, a, b) {
    const p = pos.get(a), q = pos.get(b);
    const sx = p.x + p.w / 2, sy = p.y + p.h, tx = q.x + q.w / 2, ty = q.y;
    let lane = null;
    if (ty - sy > 4 * BEND) {
      for (let tries = 0; tries < 4; tries++) {
        const x0 = lane ?? Math.min(sx, tx), x1 = lane ?? Math.max(sx, tx);
        const right = blocker(obst, a, b, sy + 1, ty - 1, x0, x1);
        if (right === null) break;
        lane = right + 2 * MARGIN;
      }
    }
    if (lane === null) {
      const bend = Math.max(20, (ty - sy) / 2);
      return { d: `M${sx},${sy} C${sx},${sy + bend} ${tx},${ty - bend} ${tx},${ty - 4}`,
        box: { x: Math.min(sx, tx), y: sy, w: Math.abs(tx - sx) + 1, h: ty - sy + 1 } };
    }
    const d = `M${sx},${sy} C${sx},${sy + BEND} ${lane},${sy + BEND} ${lane},${sy + 2 * BEND} ` +
      `L${lane},${ty - 2 * BEND} C${lane},${ty - BEND} ${tx},${ty - BEND} ${tx},${ty - 4}`;
    const x0 = Math.min(sx, tx, lane);
    return { d, box: { x: x0, y: sy, w: Math.max(sx, tx, lane) - x0 + 1, h: ty - sy + 1 } };
  }
  // One path per visible edge: {a, b, d, box}.
  window.tlRoute = function (edges, pos, boxKeys) {
    const obst = obstaclesOf(boxKeys, pos);
    return edges.map(([a, b]) => ({ a, b, ...route(obst, pos, a, b) }));
  };
})();
