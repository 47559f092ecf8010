"""Our GPT+ is transformers' Qwen3, numerically (docs/architectures.md#gpt-baseline)."""

import pytest
import torch
import transformers  # the [hf] extra: installed by `make test`, so this must not be skipped

import angpt
from angpt.hf.qwen3 import config_from_qwen3, gpt_from_qwen3_state_dict, qwen3_config_dict, to_qwen3_state_dict


def make_pair(**overrides):
    ours = angpt.build_model("gpt+", "tiny", **overrides)
    with torch.no_grad():  # non-trivial norm gains, so a swapped q/k norm or u/z branch would show
        for p in ours.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**qwen3_config_dict(ours.config)))
    missing, unexpected = hf.load_state_dict(to_qwen3_state_dict(ours), strict=True)
    assert not missing and not unexpected
    return ours.eval(), hf.eval()


@pytest.mark.parametrize("overrides", [{}, {"rope_theta": 500.0, "d_ff": 96}])
def test_gpt_plus_matches_qwen3(overrides):
    ours, hf = make_pair(**overrides)
    x = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        a, _ = ours(x)
        b = hf(x).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_qwen3_round_trip_into_gpt_plus():
    ours, hf = make_pair()
    back = gpt_from_qwen3_state_dict(config_from_qwen3(hf.config), hf.state_dict()).eval()
    x = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        assert torch.equal(back(x)[0], ours(x)[0])


def test_only_gpt_plus_maps_onto_qwen3():
    for arch, kw in [("gpt", {}), ("angpt", {}), ("gpt+", {"norm": "dyt"})]:
        with pytest.raises(ValueError, match="Qwen3"):
            qwen3_config_dict(angpt.make_config(arch, "tiny", **kw))
