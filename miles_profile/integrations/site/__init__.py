"""The directory `record --exec` puts first on a Python child's PYTHONPATH: it holds only
`sitecustomize.py` (and this file), which Python imports at start-up (integrations/autotag.py)."""
