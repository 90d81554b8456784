// Browser side of the timeline panel: turn a Plotly relayout into an x zoom request, or nothing.
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  timeline: {
    zoomFromRelayout: function (relayout) {
      if (!relayout) { return window.dash_clientside.no_update; }
      let lo = null, hi = null;
      for (const [key, value] of Object.entries(relayout)) {
        if (/^xaxis\d*\.autorange$/.test(key) && value) { return {auto: true, at: Date.now()}; }
        if (/^xaxis\d*\.range$/.test(key) && Array.isArray(value)) { [lo, hi] = value; }
        const end = key.match(/^xaxis\d*\.range\[([01])\]$/);
        if (end) { if (end[1] === "0") { lo = value; } else { hi = value; } }
      }
      if (lo === null || hi === null) { return window.dash_clientside.no_update; }
      return {range: [Number(lo), Number(hi)], at: Date.now()};
    }
  }
});
