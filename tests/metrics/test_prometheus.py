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
