#!/usr/bin/env bash
# The sglang package for tests/integration/test_sglang_contract.py: its wheel without its dependencies
# (they are SGLang's whole GPU engine), plus the two small packages its request structs need. The test
# skips without it. Its engine never runs here: docs/trainer.md, "SGLang's own schemas".
set -euo pipefail
PY=${PY:-.venv/bin/python}
# The two small packages first and the wheel last: an install with --no-deps never prints pip's resolver
# warnings, which would list every GPU-engine dependency of sglang that is deliberately absent. -qq: errors
# only (the Makefile's PIP says why).
"$PY" -m pip install -qq --no-warn-conflicts "msgspec>=0.18" "pybase64>=1.3"
"$PY" -m pip install -qq --no-deps "sglang==${SGLANG_VERSION:-0.5.23}"
