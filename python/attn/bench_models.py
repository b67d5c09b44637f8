"""python -m attn.bench --model llama|qwen2|gemma2: a small random-weight model of transformers (built from
its config, nothing downloaded) run with attn_implementation="attn" beside "sdpa" (PyTorch's
scaled_dot_product_attention; "eager" for Gemma2, which transformers runs on no sdpa) in the same run: prefill tokens per second (one forward over the prompt)
and decode tokens per second (generate()'s greedy steps after it), medians of repeated runs, and the
ratio attn / baseline (> 1: attn is faster). The attention's share of such a model's time grows with the
prompt: --prompt sets it.

    python -m attn.bench --model llama --prompt 2048 --new-tokens 32 --dtype bf16 --threads 2
"""
import time

import torch

MODELS = ("llama", "qwen2", "gemma2")


def config_of(name, layers, hidden, heads, kv_heads, head_dim):
    import transformers as t
    common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=1024,
                  max_position_embeddings=1 << 16)
    if name == "llama":
        return t.LlamaConfig(**common, head_dim=head_dim)
    if name == "qwen2":
        return t.Qwen2Config(**common)
    return t.Gemma2Config(**common, head_dim=head_dim, sliding_window=4096, attn_logit_softcapping=50.0,
                          final_logit_softcapping=None)


def _median(f, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def run(args, dtype):
    import attn.transformers  # noqa: F401  (registers "attn")
    import transformers

    torch.manual_seed(0)
    config = config_of(args.model, args.layers, args.hidden, args.heads, args.kv_heads, args.hidden // args.heads)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    # Tokens from 1: generate() would take token 0, the pad token below, for padding and mask it.
    prompt = torch.randint(1, config.vocab_size, (args.batch, args.prompt))
    print(f"{args.model}: {args.layers} layers, hidden {args.hidden}, heads {args.heads}/{args.kv_heads}, "
          f"{args.dtype}, batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens, "
          f"threads {args.threads}; tokens/s")
    base = "sdpa"
    try:
        model.set_attn_implementation("sdpa")
    except ValueError:  # no sdpa for this model (Gemma2: its soft-cap): transformers' eager attention
        base = "eager"
    rates = {}
    for impl in (base, "attn", base, "attn"):  # alternated: the machine's drift hits both alike
        model.set_attn_implementation(impl)
        generate = lambda n: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                            pad_token_id=0)
        with torch.no_grad():
            prefill = _median(lambda: model(prompt), args.reps)
            # A decode step: generate()'s time for new_tokens less its time for one (the prefill's step).
            one, full = _median(lambda: generate(1), args.reps), _median(lambda: generate(args.new_tokens), args.reps)
        decode = (full - one) / max(args.new_tokens - 1, 1)
        if decode <= 0:  # too few tokens to tell a step from the noise
            decode = float("nan")
        rates.setdefault(impl, []).append((args.batch * args.prompt / prefill, args.batch / decode))
    print(f"{'':>8} {'prefill tok/s':>14} {'decode tok/s':>13}   (the better of two alternated medians)")
    best = {impl: tuple(max(r[i] for r in runs) for i in range(2)) for impl, runs in rates.items()}
    for impl in (base, "attn"):
        print(f"{impl:>8} {best[impl][0]:>14.1f} {best[impl][1]:>13.2f}")
    print(f"{'attn/' + base:>8} {best['attn'][0] / best[base][0]:>14.2f} {best['attn'][1] / best[base][1]:>13.2f}")
    return best
