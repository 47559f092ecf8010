"""`angpt bench step`: the peer arm is the same model as our GPT+, and the table has every column filled."""

import torch

from angpt.bench.step import Qwen3Peer, bench_step, format_table
from angpt.hf.qwen3 import gpt_from_qwen3_state_dict
from angpt.train.hardware import matmul_peak


def test_qwen3_peer_is_our_gpt_plus():
    """The peer arm computes the same loss as our GPT+ with its weights: the comparison is of implementations."""
    torch.manual_seed(0)
    peer = Qwen3Peer("tiny")
    ours = gpt_from_qwen3_state_dict(peer.config, peer.hf.state_dict())
    x = torch.randint(0, peer.config.vocab_size, (2, 33))
    with torch.no_grad():
        a = peer(x[:, :-1], x[:, 1:])[1]
        b = ours(x[:, :-1], x[:, 1:])[1]
    assert torch.allclose(a, b, atol=1e-5)
    assert peer.flops_per_token(64) == ours.flops_per_token(64)


def test_bench_step_table(monkeypatch):
    rows = bench_step(["gpt+", "qwen3", "angpt"], "tiny", batch_size=2, seq_len=16, warmup=0, reps=1)
    assert [r.arch for r in rows] == ["gpt+", "qwen3", "angpt"] and rows[0].train_ratio == 1.0
    assert all(r.train_ms > 0 and r.infer_ms > 0 and 0 < r.peak_fraction for r in rows)
    table = format_table(rows)
    assert table.count("\n") == 4 and "qwen3" in table


def test_matmul_peak_is_a_rate():
    assert 1e8 < matmul_peak("fp32", torch.device("cpu"), n=256, reps=2) < 1e14
