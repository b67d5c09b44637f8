"""attn.transformers: attn_implementation="attn" in Hugging Face transformers, against transformers' own
eager attention on the same random-weight tiny models (built here, nothing downloaded): logits in f32,
bf16 held to flash-attn's rule against an f64 run, greedy generate() token for token with and without
left padding, packed sequences, a training step's gradients. Llama, Mistral and Qwen2 with sliding
windows, Qwen3, Gemma2 (soft-cap + sliding window), Gemma3 and gpt-oss (sinks)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
import attn.transformers  # noqa: E402,F401  (registers "attn")

VOCAB = 97


def _configs():
    t = transformers
    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128)
    return {
        "llama": lambda: t.LlamaConfig(**small),
        "mistral_window": lambda: t.MistralConfig(**small, sliding_window=5),
        "qwen2_window": lambda: t.Qwen2Config(**small, use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                              layer_types=["full_attention", "sliding_attention"]),
        "qwen3": lambda: t.Qwen3Config(**small, head_dim=16),
        "gemma2_softcap_window": lambda: t.Gemma2Config(**small, head_dim=16, sliding_window=5,
                                                        attn_logit_softcapping=20.0, final_logit_softcapping=None),
        "gemma3": lambda: t.Gemma3TextConfig(**small, head_dim=16, sliding_window=5),
        "gpt_oss_sinks": lambda: t.GptOssConfig(**small, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                                                sliding_window=5, layer_types=["sliding_attention", "full_attention"]),
    }


CONFIGS = _configs()


def _model(name, dtype=torch.float32):
    torch.manual_seed(1)
    config = CONFIGS[name]()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype).eval()
    if name == "gpt_oss_sinks":  # random, not zero, sinks: they must change the softmax
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


def _inputs(batch=3, seq=11, pad=(0, 3, 6)):
    torch.manual_seed(2)
    ids = torch.randint(1, VOCAB, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b, p in enumerate(pad[:batch]):
        mask[b, :p] = 0  # left padding
    return ids, mask


def _logits(model, impl, ids, mask, **kw):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask, **kw).logits


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_eager_f32_with_left_padding(name):
    model = _model(name)
    ids, mask = _inputs()
    want = _logits(model, "eager", ids, mask)
    got = _logits(model, "attn", ids, mask)
    valid = mask.bool()
    assert (got - want)[valid].abs().max().item() < 2e-5


# Unpadded: eager in f64 turns a fully padded query row into NaN (finfo(f64).min plus a negative score
# overflows to -inf), which then reaches the valid rows through P V; padding is covered in f32 above.
@pytest.mark.parametrize("name", ["llama", "gemma2_softcap_window", "gpt_oss_sinks"])
def test_bf16_within_twice_eager_bf16_error(name):
    ids, _ = _inputs()
    model = _model(name, torch.bfloat16)
    bf16_eager = _logits(model, "eager", ids, None).double()
    bf16_attn = _logits(model, "attn", ids, None).double()
    # The same bf16 weights in f64 (f32 for gpt-oss, whose expert matmuls take no f64: its error, about
    # 1e-6, is far below bf16's).
    oracle = _logits(model.float() if name == "gpt_oss_sinks" else model.double(), "eager", ids, None).double()
    err = (bf16_attn - oracle).abs().max().item()
    base = (bf16_eager - oracle).abs().max().item()
    assert err <= 2 * base, (err, base)


@pytest.mark.parametrize("name", ["llama", "qwen2_window", "gemma2_softcap_window", "gpt_oss_sinks"])
@pytest.mark.parametrize("padded", [False, True])
def test_greedy_generate_token_for_token(name, padded):
    model = _model(name)
    ids, mask = _inputs(pad=(0, 3, 6) if padded else (0, 0, 0))
    runs = {}
    for impl in ("eager", "attn"):
        model.set_attn_implementation(impl)
        runs[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                    pad_token_id=0)
    assert torch.equal(runs["eager"], runs["attn"])


def test_packed_sequences_match_each_run_alone():
    model = _model("llama")
    torch.manual_seed(3)
    lengths = [5, 9, 3]
    seqs = [torch.randint(1, VOCAB, (1, n)) for n in lengths]
    packed = torch.cat(seqs, dim=1)
    position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    model.set_attn_implementation("attn")
    with torch.no_grad():
        got = model(packed, position_ids=position_ids).logits[0]
    model.set_attn_implementation("eager")
    start = 0
    for s, n in zip(seqs, lengths):
        with torch.no_grad():
            alone = model(s).logits[0]
        assert (got[start:start + n] - alone).abs().max().item() < 2e-5
        start += n


@pytest.mark.parametrize("name", ["llama", "gemma2_softcap_window", "gpt_oss_sinks"])
def test_training_step_gradients_match_eager(name):
    # Right padding, as in training: with left padding the loss would read the logits of the last padded
    # position (its label is the first real token), which eager fills with attention over nothing.
    ids, mask = _inputs()
    mask = mask.flip(1)
    labels = ids.masked_fill(mask == 0, -100)
    grads = {}
    for impl in ("eager", "attn"):
        model = _model(name).train()
        model.set_attn_implementation(impl)
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads[impl] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["eager"].keys() == grads["attn"].keys()
    for n, g in grads["eager"].items():
        scale = g.abs().max().item() or 1.0
        assert (grads["attn"][n] - g).abs().max().item() <= 1e-4 * scale, n


def test_output_attentions_is_refused_by_name():
    model = _model("llama")
    ids, mask = _inputs()
    model.set_attn_implementation("attn")
    with pytest.raises(ValueError, match="output_attentions"):
        model(ids, attention_mask=mask, output_attentions=True)


def test_registered_in_both_interfaces():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    assert AttentionInterface._global_mapping["attn"] is attn.transformers.attention_forward
    assert "attn" in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
