"""The verdicts on the CPU workload corpus: each case recorded for real (`record --exec`, torch and
transformers programs nobody here wrote the libraries of) and judged by `visualize --json`.

A healthy case must exit 0 with no failing check; a defect case must exit 1 with the named check failing
for the named cause and no other check failing but one that points back at it (runner.CONSEQUENCE_CAUSES). `bench/verdicts.py` prints the same cases as a matrix.
"""
from __future__ import annotations

import pytest

from tests.corpus import manifest, runner

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", manifest.cases("cpu"), ids=lambda c: c.name)
def test_cpu_case_gets_its_expected_verdict(case, tmp_path):
    run_dir = runner.record_workload(case, tmp_path / case.name)
    verdict = runner.judge(run_dir)
    line = runner.verdict_line(case, verdict, runner.classify(case, verdict))
    if case.check is None:
        assert verdict["exit_code"] == 0, line
        assert runner.failing_checks(verdict) == [], line
    else:
        assert verdict["exit_code"] == 1, line
        assert runner.classify(case, verdict) in (runner.RIGHT, runner.CONSEQUENCE), line
        assert case.cause in verdict["checks"][case.check]["causes"], line
