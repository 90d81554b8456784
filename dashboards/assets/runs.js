// Browser side of the runs panel: a click on a run becomes a stamped request in `runs-clicked`. The server
// applies it by its stamp, so a click survives even when a poll's request supersedes the click's own.
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  runs: {
    clicked: function () {
      const context = window.dash_clientside.callback_context;
      const clicked = context.triggered_id;
      const fired = context.triggered && context.triggered.some(t => t.value);
      if (!clicked || !clicked.run || !fired) { return window.dash_clientside.no_update; }
      return {run: clicked.run, at: Date.now()};
    }
  }
});
