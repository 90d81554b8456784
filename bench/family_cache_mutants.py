"""Does tests/unit/test_metrics_family_cache_property.py catch a broken splice? Each mutant below is
family_cache.py with one line changed the way a mistake would change it; each runs the property test
in a copy of this tree (miles_profile/ and tests/; first unchanged, which must pass), with CI's derandomized examples and without
hypothesis' shrinking (a failure is found in the generate phase; shrinking only takes minutes). Every
mutant should be CAUGHT.

    python bench/family_cache_mutants.py [NAME ...]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/unit/test_metrics_family_cache_property.py"
SPLICE = 'line = line[:line.rindex(b" ") + 1] + floatToGoString'
# name -> (the text in family_cache.py, what it becomes)
MUTANTS = {
    "control: nothing changed (must pass)": ("", ""),
    "repr instead of floatToGoString": (SPLICE + "(value).encode()",
                                        'line = line[:line.rindex(b" ") + 1] + repr(float(value)).encode()'),
    "zero not written again": ("if value != o[2] or not value:", "if value != o[2]:"),
    "previous sample not checked plain": ("(all_before_plain or _plain(o))", "True"),
    "new sample not checked plain": ("if timestamp is None and exemplar is None and histogram is None and "
                                     "(type(value) is float or type(value) is int):", "if True:"),
    "labels not compared": ("if name == o[0] and labels == o[1] and", "if name == o[0] and"),
    "prefix loses its space": (SPLICE, 'line = line[:line.rindex(b" ")] + floatToGoString'),
    "prefix cut at the first space": (SPLICE, 'line = line[:line.index(b" ") + 1] + floatToGoString'),
    "remembered prefix cut at the first space": ('prefixes[_key(sample)] = line[:line.rindex(b" ") + 1]',
                                                 'prefixes[_key(sample)] = line[:line.index(b" ") + 1]'),
    "key of label values only": ("return (sample[0], *sample[1], *sample[1].values())",
                                 "return (sample[0], *sample[1].values())"),
    "unchanged family's shortcut without its check": (
        "if known is not None and known.plain and known.source == source:",
        "if known is not None and known.source == source:"),
    "a text body's _created header taken for the family's": (
        'if body.count(b"\\n# TYPE ") + body.startswith(b"# TYPE ") != 1:', "if False:"),
    "appended sample not checked plain": ("    for s in samples[len(before):]:\n        if _plain(s):",
                                          "    for s in samples[len(before):]:\n        if True:"),
}


def main(argv: list[str] | None = None) -> int:
    only = set(sys.argv[1:] if argv is None else argv)
    missed = 0
    for name, (text, mutant) in MUTANTS.items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for sub in ("miles_profile", "tests"):
                shutil.copytree(ROOT / sub, Path(tmp) / sub, ignore=shutil.ignore_patterns("__pycache__"))
            source = Path(tmp) / "miles_profile/metrics/family_cache.py"
            code = source.read_text()
            if text:
                assert code.count(text) == 1, name
                source.write_text(code.replace(text, mutant))
            test = Path(tmp) / TEST
            body = test.read_text()
            test.write_text(body.replace("from hypothesis import HealthCheck,", "from hypothesis import HealthCheck, Phase,")
                            .replace("@settings(", "@settings(phases=[Phase.explicit, Phase.reuse, Phase.generate], "))
            done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", TEST],
                                  cwd=tmp, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": tmp, "HYPOTHESIS_PROFILE": "ci"})
        caught = done.returncode != 0
        if not text:  # the control
            missed += caught
            print(f"{'FAILED' if caught else 'passed'}  {name}", flush=True)
            continue
        missed += not caught
        print(f"{'CAUGHT' if caught else 'MISSED'}  {name}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
