"""One module per panel of the page: `layout()` and `register(app, state)`; ids prefixed by the panel."""
