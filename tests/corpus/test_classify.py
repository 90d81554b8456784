"""How a corpus case's verdict is classified (pure: verdict dicts as runner.judge returns them)."""
from __future__ import annotations

import pytest

from tests.corpus import manifest, runner

LEAK_CASE = manifest.Case("x-leak", "mlp_adamw", "leak", "cpu", "leak", "sustained_growth", "test")
HEALTHY_CASE = manifest.Case("x-none", "mlp_adamw", "none", "cpu", None, None, "test")


def verdict(exit_code: int, **checks: tuple[str, list[str]]) -> dict:
    return {"exit_code": exit_code, "checks": {name: {"status": status, "causes": causes, "summary": "",
                                                      "first_failure": "m" if status == "fail" else ""}
                                               for name, (status, causes) in checks.items()}}


@pytest.mark.parametrize("case, judged, expected", [
    (LEAK_CASE, verdict(1, leak=("fail", ["sustained_growth"]), offload_drop=("pass", [])), runner.RIGHT),
    (LEAK_CASE, verdict(1, leak=("fail", ["one_time_step"])), runner.WRONG_CAUSE),
    (LEAK_CASE, verdict(0, leak=("pass", []), offload_drop=("pass", [])), runner.MISSED),
    (LEAK_CASE, verdict(1, leak=("fail", ["sustained_growth"]), offload_drop=("fail", ["never_freed"])),
     runner.FALSE_FAIL),
    (LEAK_CASE, verdict(1, offload_drop=("fail", ["never_freed"])), runner.FALSE_FAIL),
    (HEALTHY_CASE, verdict(0, leak=("too small to judge", []), offload_drop=("pass", [])), runner.RIGHT),
    (HEALTHY_CASE, verdict(1, leak=("fail", ["sustained_growth"])), runner.FALSE_FAIL),
    (HEALTHY_CASE, verdict(2), runner.ERROR),
    # a residual another check points back at: a consequence of the defect, not a false alarm ...
    (LEAK_CASE, verdict(1, leak=("fail", ["sustained_growth"]), serialized_peaks=("fail", ["residual"])),
     runner.CONSEQUENCE),
    # ... but never on a healthy run, and never without the defect's own check
    (HEALTHY_CASE, verdict(1, serialized_peaks=("fail", ["residual"])), runner.FALSE_FAIL),
    (LEAK_CASE, verdict(1, serialized_peaks=("fail", ["residual"])), runner.FALSE_FAIL),
])
def test_a_verdict_gets_its_class(case, judged, expected):
    assert runner.classify(case, judged) == expected


def test_the_verdict_line_names_expected_and_got():
    line = runner.verdict_line(LEAK_CASE, verdict(1, leak=("fail", ["one_time_step"])), runner.WRONG_CAUSE)
    assert line.startswith("x-leak: right check, wrong cause (expected leak/sustained_growth; got leak/one_time_step)")


def test_case_names_are_unique_programs_exist_and_causes_are_known():
    from miles_profile.verdicts.types import CAUSES
    names = [c.name for c in manifest.CASES]
    assert len(names) == len(set(names))
    for case in manifest.CASES:
        assert (runner.CORPUS / f"{case.program}.py").is_file(), case.name
        assert (case.check is None) == (case.cause is None), case.name
        assert case.cause is None or case.cause in CAUSES, case.name
