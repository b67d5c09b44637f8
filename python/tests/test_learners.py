"""attn.io and attn.check: the spec's figures and exactness from Python."""
import pytest

import attn


def test_io_model_reproduces_the_spec_figures():
    r = attn.io.model(seqlen=4096, head_dim=64, sram_bytes=192 * 1024)
    assert round(r["standard"]["bytes"] / 1e6, 1) == 136.3
    assert round(r["tiled"]["bytes"] / 1e6, 1) == 18.7
    assert r["reduction"] > 7


def test_io_count_matches_the_closed_form_and_is_exact():
    c = attn.io.count("fa2", 256, 16, 2048)
    assert c["max_abs_diff"] <= 1e-12 and c["elements"] == c["reads"] + c["writes"] > 0
    with pytest.raises(attn.AttnError, match="schedule"):
        attn.io.count("magic", 64, 16, 2048)


def test_checks_are_exact():
    assert attn.check.tiled(seq=300, head_dim=16, tile=37) <= attn.check.TOLERANCE
    assert attn.check.splitk(keys=5000, workers=7) <= attn.check.TOLERANCE
