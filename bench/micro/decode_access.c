// Decode's memory access pattern without attention arithmetic: does work mixed into the key walk hide
// under its DRAM reads, or slow them? (docs/decode.md, "Where one chunk's time goes".)
//
// K and V are [keys][8 kv heads][256 B] (bf16, d = 128). Per chunk of 64 keys, the walk loads every K
// row in key order and fetches the matching V row: VFETCH 1 prefetches it into L2 (as
// src/decode/decode_simd.cpp does), 0 not at all, 2 with demand loads; then
//   mode 0 (phased):      W x 8 register-only FMAs per key and kv head after the walk, and, with pv = 1,
//                         the chunk's V rows re-read head by head (decode's P V order);
//   mode 1 (interleaved): the FMAs after each key instead;
//   mode 2 (pipelined):   the FMAs after each key, and the previous chunk's V re-read one kv head per
//                         8 keys during this chunk's walk.
// GB/s counts K and V once (2 x keys x 2 KiB / seconds), best of `reps`.
//
//   cc -O2 -march=native -o decode_access bench/micro/decode_access.c
//   ./decode_access KEYS W MODE PV VFETCH REPS      e.g. ./decode_access 32768 0 0 1 1 10
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HEADS 8
#define ROW 256

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static __m512i reread_v(const char* v, long c0, long c1, int g, __m512i sum) {
  for (long c = c0; c < c1; c++) {
    const char* row = v + (c * HEADS + g) * ROW;
    for (int x = 0; x < ROW; x += 64) sum = _mm512_add_epi32(sum, _mm512_load_si512(row + x));
  }
  return sum;
}

int main(int argc, char** argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: %s KEYS W MODE(0 phased, 1 interleaved, 2 pipelined) PV(0/1) VFETCH(0/1/2) REPS\n",
            argv[0]);
    return 2;
  }
  const long n = atol(argv[1]) / 64 * 64;
  const int w = atoi(argv[2]), mode = atoi(argv[3]), pv = atoi(argv[4]), vfetch = atoi(argv[5]), reps = atoi(argv[6]);
  if (n <= 0 || w < 0 || mode < 0 || mode > 2 || vfetch < 0 || vfetch > 2 || reps <= 0) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  char* k = aligned_alloc(4096, (size_t)n * HEADS * ROW);
  char* v = aligned_alloc(4096, (size_t)n * HEADS * ROW);
  if (!k || !v) return 1;
  memset(k, 1, (size_t)n * HEADS * ROW);
  memset(v, 1, (size_t)n * HEADS * ROW);  // no float use of V here, so no subnormal arithmetic
  __m512 acc[8];
  for (int i = 0; i < 8; i++) acc[i] = _mm512_set1_ps(1e-7f * (float)i);
  const __m512 mul = _mm512_set1_ps(0.5f);
  __m512i sum = _mm512_setzero_si512();
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    const double t0 = now();
    for (long c0 = 0; c0 < n; c0 += 64) {
      for (long c = c0; c < c0 + 64; c++) {
        for (int g = 0; g < HEADS; g++) {
          const char* kr = k + (c * HEADS + g) * ROW;
          const char* vr = v + (c * HEADS + g) * ROW;
          for (int x = 0; x < ROW; x += 64) {
            if (vfetch == 1) __builtin_prefetch(vr + x, 0, 2);
            if (vfetch == 2) sum = _mm512_xor_si512(sum, _mm512_load_si512(vr + x));
            sum = _mm512_add_epi32(sum, _mm512_load_si512(kr + x));
          }
        }
        if (mode >= 1)
          for (int g = 0; g < HEADS; g++)
            for (int i = 0; i < w; i++)
              for (int j = 0; j < 8; j++) acc[j] = _mm512_fmadd_ps(acc[j], mul, acc[j]);
        if (mode == 2 && pv && c0 > 0 && (c - c0) % 8 == 7) sum = reread_v(v, c0 - 64, c0, (int)((c - c0) / 8), sum);
      }
      if (mode == 0)
        for (long c = 0; c < 64 * HEADS; c++)
          for (int i = 0; i < w; i++)
            for (int j = 0; j < 8; j++) acc[j] = _mm512_fmadd_ps(acc[j], mul, acc[j]);
      if (pv && mode < 2)
        for (int g = 0; g < HEADS; g++) sum = reread_v(v, c0, c0 + 64, g, sum);
    }
    const double t = now() - t0;
    if (t < best) best = t;
  }
  float s = 0;
  for (int i = 0; i < 8; i++) s += _mm512_reduce_add_ps(acc[i]);
  printf("keys %ld, W %d, %s, pv %d, V %s: %.2f ms, %.1f GB/s (%d %g)\n", n, w,
         mode == 2 ? "pipelined"
         : mode    ? "interleaved"
                   : "phased",
         pv,
         vfetch == 2 ? "demand"
         : vfetch    ? "prefetch"
                     : "none",
         best * 1e3, 2.0 * (double)n * HEADS * ROW / best / 1e9, _mm512_reduce_add_epi32(sum) & 1, (double)s);
  free(k);
  free(v);
  return 0;
}
