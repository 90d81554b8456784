"""The terminal's check lines (report/build.py): checks that cannot apply fold into one line."""
from __future__ import annotations

from types import SimpleNamespace

from miles_profile.report.build import _verdict_lines
from miles_profile.verdicts.engine import RunVerdict
from miles_profile.verdicts.types import CheckResult, Finding, gib


def _check(name: str, status: str) -> CheckResult:
    return CheckResult(name, name.title(), status, f"{name} is {status}", "why", findings=[Finding(status, "x")])


def test_checks_that_cannot_apply_fold_into_one_line():
    checks = [_check("offload_drop", "n/a"), _check("leak", "pass"), _check("serialized_peaks", "n/a"),
              _check("headroom", "fail"), _check("oom", "n/a")]
    no_summary = SimpleNamespace(lines=lambda failing=False: [])
    lines = _verdict_lines([SimpleNamespace(verdict=RunVerdict("r", checks), summary=no_summary)])
    na = [line for line in lines if "N/A" in line]
    assert na == ["  N/A   offload_drop, serialized_peaks, oom (cannot apply to this run; why: the report or --json)"]
    # the run's findings first, then the folded line, then the overall line with what was judged
    assert [line.split()[0] for line in lines[1:]] == ["PASS", "FAIL", "N/A", "FAIL"]
    assert lines[-1].split()[1] == "overall" and "2 of 5 checks judged" in lines[-1]
    # one n/a check keeps its own line and reason
    lines = _verdict_lines([SimpleNamespace(verdict=RunVerdict("r", checks[1:3]), summary=no_summary)])
    assert "  N/A   serialized_peaks  serialized_peaks is n/a" in lines


def test_a_failing_reports_first_screen_names_the_run_and_the_check():
    """Under the overall badge: each failing run linked to its checks table, with its failing checks
    (the comparison's first screen said "Overall: FAIL" and the rest was 1,100 px further down)."""
    from miles_profile.report.html import _failing_html
    def report(name, statuses):
        checks = [_check(check, status) for check, status in statuses.items()]
        return SimpleNamespace(run=SimpleNamespace(name=name), verdict=RunVerdict(name, checks))
    reports = [report("1-no-offload", {"leak": "pass"}), report("9-dist-engine-server", {"leak": "fail", "headroom": "fail"})]
    html = _failing_html(reports, single=False)
    assert html == ('<p class="verdict small" id="overall-failing">failed: '
                    '<a href="#checks-1">9-dist-engine-server</a>: leak, headroom</p>')
    assert _failing_html(reports[:1], single=True) == ""


def test_a_few_kib_below_zero_reads_as_zero_not_minus_zero():
    # an offload that dropped -11,216 bytes said "dropped -0.000 GiB" on the first screen
    assert gib(-11216) == "0.000 GiB" and gib(-0.5 * 1024 ** 3) == "-0.500 GiB" and gib(float("nan")) == "?"
