"""Continuous safeguards judged on synthetic records (:mod:`harness.checks.safeguards`):
it must fire on a sustained breach, stay quiet on a short burst, outside its phases, below
``min_requests``, and give the same answer walked tick by tick (the live monitor) as in one
pass (the judge). Instants are multiples of 1/8 s so that window edges are exact."""

from __future__ import annotations

import pytest

from harness.checks.config import SafeguardConfig
from harness.checks.safeguards import (Obs, abort_summary, armed_windows, find_breach, observations, scan,
                                       window_value)
from harness.errors import ExperimentError
from harness.experiment.config import parse_config
from tests.factories import ev, fail, make_record

STEP = 0.125   # one request ends every 1/8 s


def load(t0: float, t1: float, failing: tuple[float, float] | None = None, ttft: float = 0.1,
         slow: tuple[float, float] | None = None) -> list:
    """A request ending every STEP s in [t0, t1); those ending in ``failing`` fail (HTTP 500),
    those ending in ``slow`` have a TTFT of 2 s."""
    out = []
    n = int(round((t1 - t0) / STEP))
    for i in range(n):
        end = t0 + i * STEP
        if failing and failing[0] <= end < failing[1]:
            out.append(fail(send_time=end - 0.25, after_s=0.25))
        else:
            t = 2.0 if slow and slow[0] <= end < slow[1] else ttft
            r = make_record(send_time=0.0, ttft=t, gaps=[0.0], chunk_tokens=[1, 1], tail_s=0.0)
            r.send_time = end - r.e2e_s
            out.append(r)
    return out


ERR = SafeguardConfig(metric="error_rate", limit=0.5, window_s=2, for_s=2, min_requests=3)
ARMED = [(100.0, 130.0)]


def test_window_value_counts_the_requests_that_ended_in_the_window():
    obs = observations(load(100, 104, failing=(102, 103)))
    rate, n = window_value(obs, "error_rate", 101.0, 103.0)
    assert n == 16 and rate == pytest.approx(8 / 16)
    assert window_value(obs, "error_rate", 200.0, 201.0) == (None, 0)
    p95, n = window_value(obs, "ttft_p95_s", 100.0, 101.0)
    assert n == 8 and p95 == pytest.approx(0.1)


def test_a_sustained_error_burst_fires_when_it_has_lasted_for_s():
    # errors from 110 on: the 2 s window is > 50% failed from 111.0 (9 of 16), for 2 s -> due 113.0
    b = find_breach(load(100, 130, failing=(110, 120)), ERR, ARMED)
    assert b is not None
    assert b.breach_start == pytest.approx(111.0) and b.due_at == pytest.approx(113.0)
    assert b.observed == pytest.approx(1.0) and b.n == 16
    assert b.safeguard == "error_rate" and b.limit == 0.5


def test_a_short_burst_stays_quiet():
    # 1.5 s of errors: the window goes over 50% at 111.0 and back under at 111.625, < for_s
    assert find_breach(load(100, 130, failing=(110, 111.5)), ERR, ARMED) is None
    # no errors at all
    assert find_breach(load(100, 130), ERR, ARMED) is None


def test_for_s_zero_fires_at_the_first_window_over_the_limit():
    b = find_breach(load(100, 130, failing=(110, 111.5)), ERR.model_copy(update={"for_s": 0.0}), ARMED)
    assert b is not None and b.breach_start == pytest.approx(111.0) and b.due_at == b.breach_start


def test_errors_outside_the_armed_phases_are_not_judged():
    recs = load(100, 130, failing=(110, 120))
    assert find_breach(recs, ERR, [(100.0, 109.0), (121.0, 130.0)]) is None
    # the window never reaches back before its armed interval: errors just before it do not count
    assert find_breach(recs, ERR, [(119.5, 130.0)]) is None


def test_too_few_requests_are_not_judged():
    recs = [fail(send_time=110.0 + i, after_s=0.1) for i in range(10)]   # one failure a second
    assert find_breach(recs, ERR, ARMED) is None                          # 2 per 2 s window < 3
    assert find_breach(recs, ERR.model_copy(update={"min_requests": 2}), ARMED) is not None


def test_latency_safeguard_fires_on_slow_first_tokens():
    sg = SafeguardConfig(metric="ttft_p95_s", limit=1.0, window_s=2, for_s=1, min_requests=5)
    assert find_breach(load(100, 130), sg, ARMED) is None
    b = find_breach(load(100, 130, slow=(115, 125)), sg, ARMED)
    assert b is not None and b.observed == pytest.approx(2.0)
    assert 115.0 <= b.breach_start <= 115.25 and b.due_at == pytest.approx(b.breach_start + 1.0)


def test_walking_tick_by_tick_finds_the_same_breach_as_one_pass():
    obs = observations(load(100, 130, failing=(110, 120)))
    whole = find_breach(obs, ERR, ARMED)
    since, over, found = 100.0 - 1e-9, None, None
    t = 100.0
    while found is None and t < 130:
        t += 0.2
        found, over = scan(obs, ERR, ARMED, since, t, over)
        since = t
    assert found is not None and found.breach_start == pytest.approx(whole.breach_start)
    assert found.due_at == pytest.approx(whole.due_at) and t - found.due_at < 0.2 + 1e-9


def test_armed_windows_are_the_phases_inside_the_monitored_span():
    evs = [ev(100, "phase_start", phase="baseline"), ev(110, "phase_start", phase="fault"),
           ev(112, "safeguards_armed", source="safeguards"), ev(120, "phase_start", phase="recovery"),
           ev(130, "phase_start", phase="after"), ev(140, "safeguards_disarmed", source="safeguards")]
    assert armed_windows(evs, ["fault", "recovery"], until=150) == [(112, 130)]   # merged
    assert armed_windows(evs, ["after"], until=150) == [(130, 140)]
    assert armed_windows(evs[:2], ["fault"], until=150) == []                     # never armed


def test_abort_summary_measures_detection_latency():
    evs = [ev(113.3, "safeguard_breached", source="safeguards", safeguard="error_rate", metric="error_rate",
              observed=1.0, n=16, limit=0.5, window_s=2, for_s=2, breach_start=111.0, due_at=113.0),
           ev(113.31, "safeguard_abort", source="safeguards", safeguard="error_rate", reason="aborted by ...")]
    ab = abort_summary(evs, fault_time=109.0)
    assert ab["detection_latency_s"] == pytest.approx(0.31)
    assert ab["breach_to_abort_s"] == pytest.approx(2.31) and ab["fault_to_abort_s"] == pytest.approx(4.31)
    assert abort_summary(evs[:1], 109.0) is None


@pytest.mark.parametrize("raw, field", [
    ({"metric": "error_rate", "limit": 1.5}, "safeguards.0.limit"),
    ({"metric": "tokens_per_s", "limit": 1}, "safeguards.0.metric"),
    ({"metric": "error_rate", "limit": 0.5, "window_s": 0}, "safeguards.0.window_s"),
    ({"metric": "error_rate", "limit": 0.5, "phases": ["baseline"]}, "safeguards.0.phases.0"),
    ({"metric": "error_rate", "limit": 0.5, "phases": []}, "safeguards.0.phases"),
    ({"metric": "error_rate", "limit": 0.5, "min_requests": 0}, "safeguards.0.min_requests"),
    ({"metric": "error_rate", "limit": 0.5, "for": 2}, "safeguards.0.for"),
])
def test_bad_safeguards_name_the_field(raw, field):
    with pytest.raises(ExperimentError) as exc:
        parse_config({"safeguards": [raw]})
    assert f"configuration.specchaos.{field}" in exc.value.one_line()


def test_two_safeguards_with_one_name_are_refused():
    with pytest.raises(ExperimentError, match="named 'error_rate'"):
        parse_config({"safeguards": [{"metric": "error_rate", "limit": 0.5},
                                     {"metric": "error_rate", "limit": 0.9, "for_s": 1}]})


def test_observations_skip_unended_requests():
    assert observations([fail(after_s=None)]) == []
    (o,) = observations([fail(send_time=5.0, after_s=0.5)])
    assert o == Obs(5.5, True, None, None)


def _judged_safeguard(records, events, **sg):
    from harness.checks import safeguards
    from harness.checks.run import recorded_run
    from harness.experiment.config import SpecchaosConfig

    cfg = SpecchaosConfig(safeguards=[dict(metric="error_rate", limit=0.5, window_s=2, for_s=2, min_requests=3) | sg])
    (c,) = safeguards.check(recorded_run(records, [], events, cfg))
    return c


MONITORED = [ev(100, "phase_start", phase="fault"), ev(100, "safeguards_armed", source="safeguards"),
             ev(130, "safeguards_disarmed", source="safeguards")]


def test_a_quiet_safeguard_with_full_windows_passes_and_a_breach_fails():
    c = _judged_safeguard(load(100, 130), MONITORED)
    assert c.passed is True and "windows of up to 16 requests" in c.detail
    c = _judged_safeguard(load(100, 130, failing=(110, 120)), MONITORED)
    assert c.failed and c.observed == pytest.approx(1.0)


def test_a_safeguard_with_nothing_to_judge_is_not_judged_never_a_vacuous_pass():
    """No window ever held ``min_requests`` requests (or the monitor never watched the
    phase): the safeguard could not have breached, so it is N/J with the reason."""
    sparse = load(100, 130)[::32]                                  # one request every 4 s: 1 per 2 s window
    c = _judged_safeguard(sparse, MONITORED)
    assert c.passed is None and not c.judged
    assert c.detail.startswith("not judged: ") and "min_requests 3" in c.detail and "at most 1" in c.detail
    c = _judged_safeguard(load(100, 130), MONITORED[:1])           # never armed
    assert c.passed is None and "never watched" in c.detail
    c = _judged_safeguard(load(100, 130), MONITORED, phases=["after"])   # the after phase never ran
    assert c.passed is None and "never watched" in c.detail
