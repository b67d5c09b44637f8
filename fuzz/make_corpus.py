#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/<target>/: for each target, valid problems of every dtype with
each option flag, and one input per corruption kind (byte 1 = 150 + kind), the rest deterministic
pseudo-random bytes. Re-run after changing the byte layout of a harness (fuzz_attention.cpp,
fuzz_varlen.cpp, fuzz_decode.cpp, fuzz_backward.cpp); `make_corpus.py varlen decode` rewrites only those targets."""
import os, random, sys

# target -> number of corruption kinds (kCount in its harness)
# (a kind added at the end of a harness's enum only appends a seed: the earlier ones are rewritten as before)
CORRUPTIONS = {"reference": 20, "tiled": 20, "splitk": 20, "splitk_partials": 20,  # fuzz_attention.cpp
               "varlen": 25,  # fuzz_varlen.cpp
               "decode": 27,  # fuzz_decode.cpp
               "backward": 17}  # fuzz_backward.cpp

def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    for t in sys.argv[1:] or list(CORRUPTIONS):
        d = os.path.join(root, t)
        os.makedirs(d, exist_ok=True)
        rng = random.Random(t)
        seeds = []
        for dtype in range(4):
            for opt in (0, 4, 8, 16, 32, 64, 4 | 8 | 16 | 64, 128):
                seeds.append(bytes([dtype | opt, rng.randrange(150)]) + rng.randbytes(rng.randrange(16, 200)))
        for c in range(CORRUPTIONS[t]):
            seeds.append(bytes([rng.randrange(128), 150 + c]) + rng.randbytes(rng.randrange(16, 120)))
        for i, s in enumerate(seeds):
            with open(os.path.join(d, "seed-%03d" % i), "wb") as f:
                f.write(s)

if __name__ == "__main__":
    main()
