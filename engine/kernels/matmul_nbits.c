/*
 * MatMulNBits for ONNX Runtime's CPU provider, computed the same way for a row whatever the
 * number of rows in the call.
 *
 * The operator `engine.kernels::MatMulNBits` takes the inputs, outputs and attributes of
 * `com.microsoft::MatMulNBits` (A fp32 [..., K]; B uint8 [N, blocks, block * bits / 8];
 * scales fp32; optional uint8 zero points; optional bias) for 4- and 8-bit weights in blocks
 * of 16 to 256. engine/model/graph_passes.py gives it only such nodes whose weights are
 * constants; the rest keep ONNX Runtime's kernel.
 *
 * Why: ONNX Runtime's kernel takes another path for one row than for many (and splits the
 * work by rows), so the last prompt token gives other logits as a one-row decode step (a
 * prompt whose KV is reused) than inside a prefill, and a prefill in chunks other logits
 * than a prefill at once. Greedy answers then change at near-ties. Here each output value
 * is computed by one task, in one order that depends on neither the number of rows nor the
 * number of threads nor the vector unit:
 *
 * - accuracy_level 4: each row's activations are quantized per block to
 *   int8 (scale = absolute max / 127, rounded to nearest even); the integer dot product of a
 *   block is exact; the blocks add up in order as acc = acc + (scale_a * scale_w) * dot.
 * - other accuracy levels (fp32): per block, four partial sums (k mod 4) of a * (code - zero
 *   point) in order of k, added as (p0 + p1) + (p2 + p3), then acc = acc + scale_w * block.
 *
 * No multiply-add is fused (the file is compiled with fp-contract off), so the plain C loops
 * and the AVX-512 VNNI code give the same bits. The work is split by groups of 16 output
 * columns (ParallelFor, the session's own threads); rows go through a group in tiles that
 * share the unpacked weights. The constant weights are repacked once, while the session
 * loads (at the first run where they are not constants of the graph), in the order the
 * loops read them: each block of a group its codes then its scales, so that a task reads one
 * stream of memory.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "ort_api.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86_PATHS 1
#endif

#if defined(_MSC_VER)
#include <intrin.h>
#define LOAD_ACQUIRE(p) _InterlockedCompareExchange((volatile long*)(p), 0, 0)
#define EXCHANGE(p, v) _InterlockedExchange((volatile long*)(p), (v))
#define STORE_RELEASE(p, v) _InterlockedExchange((volatile long*)(p), (v))
#else
#define LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define EXCHANGE(p, v) __atomic_exchange_n((p), (v), __ATOMIC_ACQUIRE)
#define STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#endif

enum { ELEM_UINT8 = 2 };
#define NC 16      /* output columns per group (one AVX-512 register of floats) */
#define RT 4       /* rows per tile */
#define MAX_BLOCK 256
/* How far ahead of its loads the vector code asks for weights, in bytes: the hardware
   prefetcher stops at each 4 KiB page. Measured 2026-12-05 on the 2-core x86-64 VM (24 GiB,
   AVX-512 VNNI), decode of a 0.5B-class int4 model after 32 tokens, fresh processes taking
   turns, medians: none 15.4, 1 KiB 16.7-17.1, 2 KiB 16.5-17.5, 4 KiB 14.0 tok/s (load 6-7;
   build with CFLAGS=-DPREFETCH_AHEAD=n to compare); the AVX2 code on the same machine
   (ONNX_GENAI_KERNELS=avx2): none 13.3, 2 KiB 15.4 (load 6). */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2048
#endif

/* A, B, scales, zero_points, g_idx, bias; then the engine's own: offsets, fp32 [blocks, N],
   adding sum over b of (the sum of A's block b) * offsets[b, n] to each output (the blocks'
   minimums of GGUF Q4_1 and K-quants: the graph's Add(MatMulNBits(x), MatMul(block sums of x,
   offsets)) in one node, engine/model/matmul_pass.py). */
#define MM_INPUTS 7
static const int MM_TYPES[MM_INPUTS] = {ELEM_FLOAT, ELEM_UINT8, ELEM_FLOAT, ELEM_UINT8,
                                        ELEM_INT32, ELEM_FLOAT, ELEM_FLOAT};

typedef struct MatMul {
  int64_t K, N, bits, block, accuracy;
  int64_t blocks, groups, bytes; /* blocks along K, groups of NC columns, code bytes per group block */
  int64_t stride;                /* bytes per group block: its codes, then its NC scales */
  long ready;                    /* the repacked weights below are there (atomic) */
  long busy;                     /* a run is repacking them (atomic) */
  void* memory;                  /* what `codes` was carved from (aligned to a cache line) */
  uint8_t* codes;                /* [groups][blocks][stride]: bytes of codes, NC fp32 scales */
  uint8_t* zero;                 /* [groups][blocks][NC], or NULL: all zdefault */
  int32_t zdefault;              /* 8 for 4 bits, 128 for 8 */
  float* offsets;                /* [groups][blocks][NC], or NULL */
} MatMul;

/* Group g's block b: its codes, then its scales (one stream of memory per task). */
static inline uint8_t* codes_at(const MatMul* m, int64_t g, int64_t b) { return m->codes + (g * m->blocks + b) * m->stride; }
static inline float* scales_at(const MatMul* m, int64_t g, int64_t b) {
  return (float*)(codes_at(m, g, b) + m->bytes);
}

/* 1: AVX-512 with VNNI; 2: AVX2 (4-bit codes at accuracy level 4; the plain C loops for the
   rest); 0: the plain C loops (set at registration). */
static int g_mm_isa;

/* ---- repacking ------------------------------------------------------------------ */

/* Group block layout: quad j (k = 4j .. 4j+3 of the block) is 64 bytes, column c's four
   codes at 4c .. 4c+3. 8 bits: quad j at byte 64j. 4 bits: quads j and j + block/8 share
   the 64 bytes of pair j, low and high nibbles. */
/* The four nibbles of `v` (low first) in the low nibbles of four bytes. */
static inline uint32_t spread_nibbles(uint32_t v) {
  return (v & 0xFu) | (v & 0xF0u) << 4 | (v & 0xF00u) << 8 | (v & 0xF000u) << 12;
}

static void repack(MatMul* m, const uint8_t* B, const float* scales, const uint8_t* zp, const float* offsets) {
  const int64_t blob = m->block * m->bits / 8, half = m->block / 8;
  const int64_t zp_row = m->bits == 4 ? (m->blocks + 1) / 2 : m->blocks;
  for (int64_t g = 0; g < m->groups; ++g) {
    for (int64_t b = 0; b < m->blocks; ++b) {
      uint8_t* dst = codes_at(m, g, b);
      float* s = scales_at(m, g, b);
      uint8_t* z = m->zero != NULL ? m->zero + (g * m->blocks + b) * NC : NULL;
      for (int64_t c = 0; c < NC; ++c) {
        const int64_t n = g * NC + c;
        if (m->offsets != NULL)
          m->offsets[(g * m->blocks + b) * NC + c] = n < m->N ? offsets[b * m->N + n] : 0.0f;
        if (n >= m->N) {
          s[c] = 0.0f;
          if (z != NULL) z[c] = 0;
          continue;
        }
        s[c] = scales[n * m->blocks + b];
        if (z != NULL)
          z[c] = m->bits == 4 ? (uint8_t)((zp[n * zp_row + b / 2] >> (4 * (b & 1))) & 15) : zp[n * zp_row + b];
        const uint8_t* src = B + (n * m->blocks + b) * blob;
        if (m->bits == 8) {
          for (int64_t j = 0; j < m->block / 4; ++j) memcpy(dst + j * 64 + c * 4, src + 4 * j, 4);
          continue;
        }
        /* pair p: quad p's four codes in the low nibbles, quad p + half's in the high ones;
           a quad's codes are two source bytes, low nibble first (a word at a time: the repack
           of a 135M model took ~300 ms code by code) */
        for (int64_t p = 0; p < half; ++p) {
          const uint32_t lo = (uint32_t)src[2 * p] | (uint32_t)src[2 * p + 1] << 8;
          const uint32_t hi = (uint32_t)src[2 * (p + half)] | (uint32_t)src[2 * (p + half) + 1] << 8;
          const uint32_t word = spread_nibbles(lo) | spread_nibbles(hi) << 4;
          memcpy(dst + p * 64 + c * 4, &word, 4);
        }
      }
    }
  }
}

/* ---- the activations ------------------------------------------------------------ */

typedef struct Rows {
  int64_t M, K, Kp;   /* rows, K, K padded to whole blocks */
  const float* a;     /* [M, K] as given */
  float* af;          /* [M, Kp] fp32, zero-padded (accuracy 0) */
  int8_t* qa;         /* [M, Kp] int8 (accuracy 4) */
  float* sa;          /* [M, blocks] */
  int32_t* asum;      /* [M, blocks] */
  float* bsum;        /* [M, blocks]: each block's sum, in order (with offsets only) */
} Rows;

/* The sum of each block of each row, in order of k: the same for every path and M. */
static void block_sums(const MatMul* m, Rows* r) {
  for (int64_t row = 0; row < r->M; ++row)
    for (int64_t b = 0; b < m->blocks; ++b) {
      const int64_t k0 = b * m->block;
      const int64_t n = r->K - k0 < m->block ? r->K - k0 : m->block;
      float sum = 0.0f;
      for (int64_t k = 0; k < n; ++k) sum += r->a[row * r->K + k0 + k];
      r->bsum[row * m->blocks + b] = sum;
    }
}

/* Each row's blocks as int8 with a scale: the same code for every path and every M. */
static void quantize_rows(const MatMul* m, Rows* r) {
  for (int64_t row = 0; row < r->M; ++row) {
    const float* a = r->a + row * r->K;
    for (int64_t b = 0; b < m->blocks; ++b) {
      const int64_t k0 = b * m->block;
      const int64_t n = r->K - k0 < m->block ? r->K - k0 : m->block;
      float amax = 0.0f;
      for (int64_t k = 0; k < n; ++k) {
        const float v = fabsf(a[k0 + k]);
        amax = v > amax ? v : amax;
      }
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t* q = r->qa + row * r->Kp + k0;
      int32_t sum = 0;
      for (int64_t k = 0; k < n; ++k) {
        /* |a * inv| <= 127: adding and taking away 1.5 * 2^23 rounds it to the nearest
           integer, ties to even, in any vector unit (a libm call per value otherwise) */
        const float x = (a[k0 + k] * inv + 12582912.0f) - 12582912.0f;
        const int32_t v = x > 127.0f ? 127 : x < -127.0f ? -127 : (int32_t)x;
        q[k] = (int8_t)v;
        sum += v;
      }
      for (int64_t k = n; k < m->block; ++k) q[k] = 0;
      r->sa[row * m->blocks + b] = amax / 127.0f;
      r->asum[row * m->blocks + b] = sum;
    }
  }
}

static void pad_rows(const MatMul* m, Rows* r) {
  for (int64_t row = 0; row < r->M; ++row) {
    memcpy(r->af + row * r->Kp, r->a + row * r->K, (size_t)r->K * sizeof(float));
    memset(r->af + row * r->Kp + r->K, 0, (size_t)(r->Kp - r->K) * sizeof(float));
  }
  (void)m;
}

typedef struct Job {
  const MatMul* m;
  const Rows* r;
  const float* bias;
  float* y; /* [M, N] */
} Job;

/* ---- plain C (the reference every path matches) --------------------------------- */

/* The zero points of group g's block b. */
static inline void zero_points(const MatMul* m, int64_t g, int64_t b, int32_t* z) {
  for (int64_t c = 0; c < NC; ++c) z[c] = m->zero != NULL ? m->zero[(g * m->blocks + b) * NC + c] : m->zdefault;
}

static inline uint8_t code_at(const MatMul* m, const uint8_t* blk, int64_t j, int64_t c, int64_t i) {
  if (m->bits == 8) return blk[j * 64 + c * 4 + i];
  const int64_t half = m->block / 8;
  const uint8_t byte = blk[(j < half ? j : j - half) * 64 + c * 4 + i];
  return j < half ? (uint8_t)(byte & 15) : (uint8_t)(byte >> 4);
}

static void store(const Job* job, int64_t row, int64_t g, const float* acc) {
  const int64_t N = job->m->N;
  float* y = job->y + row * N;
  for (int64_t c = 0; c < NC && g * NC + c < N; ++c) {
    const int64_t n = g * NC + c;
    y[n] = job->bias != NULL ? acc[c] + job->bias[n] : acc[c];
  }
}

HOT static void group_int8_c(const Job* job, int64_t g) {
  const MatMul* m = job->m;
  const Rows* r = job->r;
  const int64_t quads = m->block / 4;
  uint8_t w[MAX_BLOCK / 4][NC][4];
  for (int64_t row = 0; row < r->M; ++row) {
    float acc[NC] = {0};
    for (int64_t b = 0; b < m->blocks; ++b) {
      const uint8_t* blk = codes_at(m, g, b);
      for (int64_t j = 0; j < quads; ++j)
        for (int64_t c = 0; c < NC; ++c)
          for (int64_t i = 0; i < 4; ++i) w[j][c][i] = code_at(m, blk, j, c, i);
      const int8_t* qa = r->qa + row * r->Kp + b * m->block;
      int32_t dot[NC] = {0};
      for (int64_t j = 0; j < quads; ++j)
        for (int64_t c = 0; c < NC; ++c)
          for (int64_t i = 0; i < 4; ++i) dot[c] += (int32_t)w[j][c][i] * (int32_t)qa[4 * j + i];
      const float sa = r->sa[row * m->blocks + b];
      const int32_t asum = r->asum[row * m->blocks + b];
      const float* sw = scales_at(m, g, b);
      int32_t zw[NC];
      zero_points(m, g, b, zw);
      for (int64_t c = 0; c < NC; ++c) {
        const float t = sa * sw[c];
        acc[c] = acc[c] + t * (float)(dot[c] - zw[c] * asum);
      }
      if (m->offsets != NULL) {
        const float bs = r->bsum[row * m->blocks + b];
        const float* off = m->offsets + (g * m->blocks + b) * NC;
        for (int64_t c = 0; c < NC; ++c) acc[c] = acc[c] + bs * off[c];
      }
    }
    store(job, row, g, acc);
  }
}

HOT static void group_fp32_c(const Job* job, int64_t g) {
  const MatMul* m = job->m;
  const Rows* r = job->r;
  const int64_t quads = m->block / 4;
  for (int64_t row = 0; row < r->M; ++row) {
    float acc[NC] = {0};
    for (int64_t b = 0; b < m->blocks; ++b) {
      const uint8_t* blk = codes_at(m, g, b);
      const float* a = r->af + row * r->Kp + b * m->block;
      const float* sw = scales_at(m, g, b);
      int32_t zw[NC];
      zero_points(m, g, b, zw);
      float p[NC][4] = {{0}};
      for (int64_t j = 0; j < quads; ++j)
        for (int64_t c = 0; c < NC; ++c)
          for (int64_t i = 0; i < 4; ++i)
            p[c][i] = p[c][i] + a[4 * j + i] * (float)((int32_t)code_at(m, blk, j, c, i) - zw[c]);
      for (int64_t c = 0; c < NC; ++c) {
        const float part = (p[c][0] + p[c][1]) + (p[c][2] + p[c][3]);
        acc[c] = acc[c] + sw[c] * part;
      }
      if (m->offsets != NULL) {
        const float bs = r->bsum[row * m->blocks + b];
        const float* off = m->offsets + (g * m->blocks + b) * NC;
        for (int64_t c = 0; c < NC; ++c) acc[c] = acc[c] + bs * off[c];
      }
    }
    store(job, row, g, acc);
  }
}

/* ---- AVX-512 with VNNI ---------------------------------------------------------- */

#ifdef HAVE_X86_PATHS
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* Rows row0 .. row0+R-1 of group g (R a constant after inlining: the accumulators stay in
   registers). Each row's arithmetic is the plain C's, in the same order. */
AVX512 static inline __attribute__((always_inline)) void tile_int8_avx512(const Job* job, int64_t g, int64_t row0,
                                                                           const int R) {
  const MatMul* m = job->m;
  const Rows* r = job->r;
  const int64_t half = m->block / 8, quads = m->block / 4;
  const __m512i low = _mm512_set1_epi8(15);
  __m512 acc[RT];
  for (int t = 0; t < R; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < m->blocks; ++b) {
    const uint8_t* blk = codes_at(m, g, b);
    __m512i d0[RT], d1[RT];
    for (int t = 0; t < R; ++t) d0[t] = d1[t] = _mm512_setzero_si512();
    const int8_t* qa = r->qa + row0 * r->Kp + b * m->block;
    if (PREFETCH_AHEAD > 0) /* past the group's end: the next group's, in memory after it */
      for (int64_t o = 0; o < m->stride; o += 64) _mm_prefetch((const char*)blk + PREFETCH_AHEAD + o, _MM_HINT_T0);
    if (m->bits == 4) {
      for (int64_t p = 0; p < half; ++p) {
        const __m512i v = _mm512_loadu_si512((const void*)(blk + p * 64));
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int t = 0; t < R; ++t) {
          int32_t x0, x1;
          memcpy(&x0, qa + t * r->Kp + 4 * p, 4);
          memcpy(&x1, qa + t * r->Kp + 4 * (p + half), 4);
          d0[t] = _mm512_dpbusd_epi32(d0[t], lo, _mm512_set1_epi32(x0));
          d1[t] = _mm512_dpbusd_epi32(d1[t], hi, _mm512_set1_epi32(x1));
        }
      }
    } else {
      for (int64_t j = 0; j < quads; j += 2) {
        const __m512i v0 = _mm512_loadu_si512((const void*)(blk + j * 64));
        const __m512i v1 = _mm512_loadu_si512((const void*)(blk + j * 64 + 64));
        for (int t = 0; t < R; ++t) {
          int32_t x0, x1;
          memcpy(&x0, qa + t * r->Kp + 4 * j, 4);
          memcpy(&x1, qa + t * r->Kp + 4 * j + 4, 4);
          d0[t] = _mm512_dpbusd_epi32(d0[t], v0, _mm512_set1_epi32(x0));
          d1[t] = _mm512_dpbusd_epi32(d1[t], v1, _mm512_set1_epi32(x1));
        }
      }
    }
    const __m512 sw = _mm512_loadu_ps(scales_at(m, g, b));
    const __m512i zw = m->zero != NULL
                           ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(m->zero + (g * m->blocks + b) * NC)))
                           : _mm512_set1_epi32(m->zdefault);
    for (int t = 0; t < R; ++t) {
      const int64_t at = (row0 + t) * m->blocks + b;
      const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(d0[t], d1[t]),
                                           _mm512_mullo_epi32(zw, _mm512_set1_epi32(r->asum[at])));
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(r->sa[at]), sw);
      acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(s, _mm512_cvtepi32_ps(dot)));
      if (m->offsets != NULL)
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(r->bsum[at]),
                                                     _mm512_loadu_ps(m->offsets + (g * m->blocks + b) * NC)));
    }
  }
  for (int t = 0; t < R; ++t) {
    float out[NC];
    _mm512_storeu_ps(out, acc[t]);
    store(job, row0 + t, g, out);
  }
}

AVX512 static void group_int8_avx512(const Job* job, int64_t g) {
  int64_t row = 0;
  for (; row + RT <= job->r->M; row += RT) tile_int8_avx512(job, g, row, RT);
  for (; row < job->r->M; ++row) tile_int8_avx512(job, g, row, 1);
}

/* quantize_rows with 16 values a step: the same operations on each value, so the same
   bits (the maximum of absolute values and the integer sum do not depend on the order). */
AVX512 static void quantize_rows_avx512(const MatMul* m, Rows* r) {
  const __m512 round = _mm512_set1_ps(12582912.0f), top = _mm512_set1_ps(127.0f), bottom = _mm512_set1_ps(-127.0f);
  for (int64_t row = 0; row < r->M; ++row) {
    const float* a = r->a + row * r->K;
    for (int64_t b = 0; b < m->blocks; ++b) {
      const int64_t k0 = b * m->block;
      const int64_t n = r->K - k0 < m->block ? r->K - k0 : m->block;
      __m512 most = _mm512_setzero_ps();
      for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 lanes = n - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - k)) - 1);
        /* max(v, most) keeps `most` where v is NaN, as the plain C's comparison does */
        most = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(lanes, a + k0 + k)), most);
      }
      const float amax = _mm512_reduce_max_ps(most);
      const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      int8_t* q = r->qa + row * r->Kp + k0;
      __m512i sum = _mm512_setzero_si512();
      for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 lanes = n - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - k)) - 1);
        const __m512 x = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, a + k0 + k), inv), round), round);
        __m512i v = _mm512_cvttps_epi32(x);
        v = _mm512_mask_mov_epi32(v, _mm512_cmp_ps_mask(x, top, _CMP_GT_OQ), _mm512_set1_epi32(127));
        v = _mm512_mask_mov_epi32(v, _mm512_cmp_ps_mask(x, bottom, _CMP_LT_OQ), _mm512_set1_epi32(-127));
        v = _mm512_maskz_mov_epi32(lanes, v);
        _mm_mask_storeu_epi8(q + k, lanes, _mm512_cvtepi32_epi8(v));
        sum = _mm512_add_epi32(sum, v);
      }
      for (int64_t k = n; k < m->block; ++k) q[k] = 0;
      r->sa[row * m->blocks + b] = amax / 127.0f;
      r->asum[row * m->blocks + b] = _mm512_reduce_add_epi32(sum);
    }
  }
}

/* Lane 0 of each 128-bit chunk becomes (x0 + x1) + (x2 + x3) of the chunk. */
AVX512 static inline __m512 sum_quads(__m512 x) {
  const __m512 t = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));  /* (1, 0, 3, 2) */
  return _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));            /* (2, 3, 0, 1) */
}

AVX512 static inline __attribute__((always_inline)) void tile_fp32_avx512(const Job* job, int64_t g, int64_t row0,
                                                                           const int R) {
  const MatMul* m = job->m;
  const Rows* r = job->r;
  const int64_t half = m->block / 8, quads = m->block / 4;
  const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  __m512 acc[RT];
  for (int t = 0; t < R; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < m->blocks; ++b) {
    const uint8_t* blk = codes_at(m, g, b);
    int32_t zp[NC];
    zero_points(m, g, b, zp);
    __m512i z[4]; /* quarter q: columns 4q .. 4q+3, each repeated over its four lanes */
    for (int q = 0; q < 4; ++q)
      z[q] = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                      _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(zp + 4 * q))));
    __m512 p[RT][4];
    for (int t = 0; t < R; ++t)
      for (int q = 0; q < 4; ++q) p[t][q] = _mm512_setzero_ps();
    for (int64_t j = 0; j < quads; ++j) {
      __m512i v;
      if (m->bits == 8) {
        v = _mm512_loadu_si512((const void*)(blk + j * 64));
      } else {
        v = _mm512_loadu_si512((const void*)(blk + (j < half ? j : j - half) * 64));
        v = j < half ? v : _mm512_srli_epi16(v, 4);
        v = _mm512_and_si512(v, _mm512_set1_epi8(15));
      }
      __m512 w[4];
      for (int q = 0; q < 4; ++q)
        w[q] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, q)), z[q]));
      for (int t = 0; t < R; ++t) {
        const __m512 a = _mm512_broadcast_f32x4(_mm_loadu_ps(r->af + (row0 + t) * r->Kp + b * m->block + 4 * j));
        for (int q = 0; q < 4; ++q) p[t][q] = _mm512_add_ps(p[t][q], _mm512_mul_ps(a, w[q]));
      }
    }
    const __m512 sw = _mm512_loadu_ps(scales_at(m, g, b));
    for (int t = 0; t < R; ++t) {
      const __m512 lo = _mm512_permutex2var_ps(sum_quads(p[t][0]), pick, sum_quads(p[t][1]));
      const __m512 hi = _mm512_permutex2var_ps(sum_quads(p[t][2]), pick, sum_quads(p[t][3]));
      const __m512 part = _mm512_shuffle_f32x4(lo, hi, 0x44);
      acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(sw, part));
      if (m->offsets != NULL)
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(r->bsum[(row0 + t) * m->blocks + b]),
                                                     _mm512_loadu_ps(m->offsets + (g * m->blocks + b) * NC)));
    }
  }
  for (int t = 0; t < R; ++t) {
    float out[NC];
    _mm512_storeu_ps(out, acc[t]);
    store(job, row0 + t, g, out);
  }
}

/* ---- AVX2 (4-bit codes, accuracy level 4) -------------------------------------- */

#define AVX2 __attribute__((target("avx2,fma")))

/* Sum of u8 codes times s8 activations over one quad, for 8 columns: maddubs adds the pairs
   into int16 (at most 2 * 15 * 127: exact for 4-bit codes) and madd the two pairs into int32,
   the same integers as VNNI's. */
AVX2 static inline __m256i quad_dot_avx2(__m256i w, int32_t a) {
  const __m256i pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(a));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

AVX2 static inline __attribute__((always_inline)) void tile_int8_avx2(const Job* job, int64_t g, int64_t row0,
                                                                       const int R) {
  const MatMul* m = job->m;
  const Rows* r = job->r;
  const int64_t half = m->block / 8;
  const __m256i low = _mm256_set1_epi8(15);
  __m256 acc[RT][2];
  for (int t = 0; t < R; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < m->blocks; ++b) {
    const uint8_t* blk = codes_at(m, g, b);
    __m256i d[RT][2];
    for (int t = 0; t < R; ++t) d[t][0] = d[t][1] = _mm256_setzero_si256();
    const int8_t* qa = r->qa + row0 * r->Kp + b * m->block;
    if (PREFETCH_AHEAD > 0)
      for (int64_t o = 0; o < m->stride; o += 64) _mm_prefetch((const char*)blk + PREFETCH_AHEAD + o, _MM_HINT_T0);
    for (int64_t p = 0; p < half; ++p) {
      for (int h = 0; h < 2; ++h) { /* columns 8h .. 8h+7 */
        const __m256i v = _mm256_loadu_si256((const __m256i*)(blk + p * 64 + h * 32));
        const __m256i lo = _mm256_and_si256(v, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int t = 0; t < R; ++t) {
          int32_t x0, x1;
          memcpy(&x0, qa + t * r->Kp + 4 * p, 4);
          memcpy(&x1, qa + t * r->Kp + 4 * (p + half), 4);
          d[t][h] = _mm256_add_epi32(d[t][h], _mm256_add_epi32(quad_dot_avx2(lo, x0), quad_dot_avx2(hi, x1)));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 sw = _mm256_loadu_ps(scales_at(m, g, b) + 8 * h);
      int32_t zp[NC];
      zero_points(m, g, b, zp);
      const __m256i zw = _mm256_loadu_si256((const __m256i*)(zp + 8 * h));
      const __m256 off = m->offsets != NULL ? _mm256_loadu_ps(m->offsets + (g * m->blocks + b) * NC + 8 * h)
                                            : _mm256_setzero_ps();
      for (int t = 0; t < R; ++t) {
        const int64_t at = (row0 + t) * m->blocks + b;
        const __m256i dot = _mm256_sub_epi32(d[t][h], _mm256_mullo_epi32(zw, _mm256_set1_epi32(r->asum[at])));
        const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(r->sa[at]), sw);
        acc[t][h] = _mm256_add_ps(acc[t][h], _mm256_mul_ps(sc, _mm256_cvtepi32_ps(dot)));
        if (m->offsets != NULL)
          acc[t][h] = _mm256_add_ps(acc[t][h], _mm256_mul_ps(_mm256_set1_ps(r->bsum[at]), off));
      }
    }
  }
  for (int t = 0; t < R; ++t) {
    float out[NC];
    _mm256_storeu_ps(out, acc[t][0]);
    _mm256_storeu_ps(out + 8, acc[t][1]);
    store(job, row0 + t, g, out);
  }
}

AVX2 static void group_int8_avx2(const Job* job, int64_t g) {
  int64_t row = 0;
  for (; row + RT <= job->r->M; row += RT) tile_int8_avx2(job, g, row, RT);
  for (; row < job->r->M; ++row) tile_int8_avx2(job, g, row, 1);
}

AVX512 static void group_fp32_avx512(const Job* job, int64_t g) {
  int64_t row = 0;
  for (; row + 2 <= job->r->M; row += 2) tile_fp32_avx512(job, g, row, 2);
  for (; row < job->r->M; ++row) tile_fp32_avx512(job, g, row, 1);
}
#endif

static void run_group(void* data, size_t task) {
  const Job* job = (const Job*)data;
  const int int8 = job->m->accuracy == 4;
#ifdef HAVE_X86_PATHS
  if (g_mm_isa == 1) {
    if (int8)
      group_int8_avx512(job, (int64_t)task);
    else
      group_fp32_avx512(job, (int64_t)task);
    return;
  }
  if (g_mm_isa == 2 && int8 && job->m->bits == 4) {
    group_int8_avx2(job, (int64_t)task);
    return;
  }
#endif
  if (int8)
    group_int8_c(job, (int64_t)task);
  else
    group_fp32_c(job, (int64_t)task);
}

/* ---- the operator --------------------------------------------------------------- */

static const char* ORT_CALL mm_name(const void* op) { (void)op; return "MatMulNBits"; }
static const char* ORT_CALL mm_provider(const void* op) { (void)op; return "CPUExecutionProvider"; }
static int ORT_CALL mm_input_type(const void* op, size_t i) { (void)op; return MM_TYPES[i]; }
static size_t ORT_CALL mm_input_count(const void* op) { (void)op; return MM_INPUTS; }
static int ORT_CALL mm_output_type(const void* op, size_t i) { (void)op; (void)i; return ELEM_FLOAT; }
static size_t ORT_CALL mm_output_count(const void* op) { (void)op; return 1; }
static int ORT_CALL mm_input_characteristic(const void* op, size_t i) {
  (void)op;
  return i < 3 ? INPUT_REQUIRED : INPUT_OPTIONAL;
}
static int ORT_CALL mm_output_characteristic(const void* op, size_t i) { (void)op; (void)i; return INPUT_REQUIRED; }
static int ORT_CALL mm_memory_type(const void* op, size_t i) { (void)op; (void)i; return 0; }
static int ORT_CALL mm_arity(const void* op) { (void)op; return 1; }
static int ORT_CALL mm_homogeneity(const void* op) { (void)op; return 1; }
static void ORT_CALL mm_compute_v1(void* kernel, OrtKernelContext* context) { (void)kernel; (void)context; }

static void ORT_CALL mm_destroy(void* p) {
  MatMul* m = (MatMul*)p;
  if (m == NULL) return;
  free(m->memory);
  free(m->zero);
  free(m->offsets);
  free(m);
}

typedef struct Input {
  void* data;
  int64_t dims[8];
  size_t rank;
  int elem;
  int64_t count;
} Input;

static OrtStatus* mm_describe(const OrtValue* value, Input* t) {
  TRY(tensor_info(value, &t->data, &t->elem, t->dims, 8, &t->rank,
                  "MatMulNBits (engine.kernels): tensor of rank above 8"));
  t->count = 1;
  for (size_t i = 0; i < t->rank; ++i) t->count *= t->dims[i];
  return NULL;
}

/* The weights in the kernel's order, made once (the first run; a run beside it waits). */
static OrtStatus* ensure_repacked(MatMul* m, const Input* B, const Input* scales, const Input* zp,
                                  const Input* offsets) {
  if (LOAD_ACQUIRE(&m->ready)) return NULL;
  while (EXCHANGE(&m->busy, 1)) {
  }
  OrtStatus* status = NULL;
  if (!m->ready) {
    const int64_t zp_row = m->bits == 4 ? (m->blocks + 1) / 2 : m->blocks;
    if (B->count != m->N * m->blocks * (m->block * m->bits / 8) || scales->count != m->N * m->blocks ||
        (zp != NULL && zp->count != m->N * zp_row) || (offsets != NULL && offsets->count != m->N * m->blocks)) {
      status = fail("MatMulNBits (engine.kernels): B, scales, zero_points or offsets do not match K, N, bits "
                    "and block_size");
    } else {
      m->memory = calloc((size_t)(m->groups * m->blocks * m->stride) + 63, 1);
      m->codes = m->memory != NULL ? (uint8_t*)(((uintptr_t)m->memory + 63) & ~(uintptr_t)63) : NULL;
      m->zdefault = m->bits == 4 ? 8 : 128;
      if (zp != NULL) m->zero = (uint8_t*)malloc((size_t)(m->groups * m->blocks * NC));
      if (offsets != NULL) m->offsets = (float*)malloc((size_t)(m->groups * m->blocks * NC) * sizeof(float));
      if (m->codes == NULL || (zp != NULL && m->zero == NULL) || (offsets != NULL && m->offsets == NULL)) {
        free(m->memory);
        free(m->zero);
        free(m->offsets);
        m->memory = m->codes = m->zero = NULL;
        m->offsets = NULL;
        status = API(CreateStatus)(ORT_FAIL, "MatMulNBits (engine.kernels): out of memory");
      } else {
        repack(m, (const uint8_t*)B->data, (const float*)scales->data,
               zp != NULL ? (const uint8_t*)zp->data : NULL, offsets != NULL ? (const float*)offsets->data : NULL);
        STORE_RELEASE(&m->ready, 1);
      }
    }
  }
  STORE_RELEASE(&m->busy, 0);
  return status;
}

/* Whether input i of the node is given (an optional input may be left empty). */
static int given_input(const OrtKernelInfo* info, size_t count, size_t i) {
  size_t size = 0;
  if (i >= count) return 0;
  OrtStatus* status = API(KernelInfo_GetInputName)(info, i, NULL, &size);
  if (status != NULL) {
    API(ReleaseStatus)(status);
    return 1; /* cannot tell: taken as given, which keeps the repack for the first run */
  }
  return size > 1;
}

/* Input i as a constant of the graph, into *t (0 where it is not one or cannot be read). */
static int constant_input(const OrtKernelInfo* info, size_t i, Input* t) {
  int is_constant = 0;
  const OrtValue* value = NULL;
  OrtStatus* status = API(KernelInfoGetConstantInput_tensor)(info, i, &is_constant, &value);
  if (status == NULL && is_constant && value != NULL) status = mm_describe(value, t);
  else if (status == NULL) return 0;
  if (status != NULL) {
    API(ReleaseStatus)(status);
    return 0;
  }
  return 1;
}

/* The weights repacked while the session loads, where every weight input is a constant of
   the graph: the first run is not slowed by it, and the copy is in memory before the
   engine moves the model's memory onto huge pages (engine/runtime/hugepages.py; made at the
   first run, after that, the copy stayed on 4 KiB pages). Elsewhere the first run repacks
   (ensure_repacked); a failure here is reported there too. */
static void repack_at_load(MatMul* m, const OrtKernelInfo* info) {
  size_t count = 0;
  OrtStatus* status = API(KernelInfo_GetInputCount)(info, &count);
  if (status != NULL) {
    API(ReleaseStatus)(status);
    return;
  }
  Input B, S, Z, O;
  const int zp = given_input(info, count, 3), off = given_input(info, count, 6);
  if (given_input(info, count, 4) || !constant_input(info, 1, &B) || !constant_input(info, 2, &S) ||
      (zp && !constant_input(info, 3, &Z)) || (off && !constant_input(info, 6, &O)))
    return;
  status = ensure_repacked(m, &B, &S, zp ? &Z : NULL, off ? &O : NULL);
  if (status != NULL) API(ReleaseStatus)(status);
}

static OrtStatus* ORT_CALL mm_create(const void* op, const void* api, const OrtKernelInfo* info, void** out) {
  (void)op;
  (void)api;
  MatMul* m = (MatMul*)calloc(1, sizeof(MatMul));
  if (m == NULL) return API(CreateStatus)(ORT_FAIL, "out of memory");
  m->K = attr_int(info, "K", 0);
  m->N = attr_int(info, "N", 0);
  m->bits = attr_int(info, "bits", 4);
  m->block = attr_int(info, "block_size", 0);
  m->accuracy = attr_int(info, "accuracy_level", 0);
  if (m->K <= 0 || m->N <= 0 || (m->bits != 4 && m->bits != 8) || m->block < 16 || m->block > MAX_BLOCK ||
      (m->block & (m->block - 1)) != 0) {
    free(m);
    return fail("MatMulNBits (engine.kernels): needs K > 0, N > 0, bits 4 or 8 and block_size a power of two "
                "from 16 to 256");
  }
  m->blocks = (m->K + m->block - 1) / m->block;
  m->groups = (m->N + NC - 1) / NC;
  m->bytes = m->block * NC * m->bits / 8;
  m->stride = m->bytes + NC * (int64_t)sizeof(float);
  repack_at_load(m, info);
  *out = m;
  return NULL;
}

static OrtStatus* ORT_CALL mm_compute(void* p, OrtKernelContext* context) {
  MatMul* m = (MatMul*)p;
  size_t n_inputs = 0;
  TRY(API(KernelContext_GetInputCount)(context, &n_inputs));
  if (n_inputs > MM_INPUTS) n_inputs = MM_INPUTS;
  const OrtValue* inputs[MM_INPUTS] = {0};
  for (size_t i = 0; i < n_inputs; ++i) TRY(API(KernelContext_GetInput)(context, i, &inputs[i]));
  if (inputs[4] != NULL) return fail("MatMulNBits (engine.kernels): g_idx is not handled");
  Input A, B, S, Z, bias, offsets;
  if (inputs[6] != NULL) TRY(mm_describe(inputs[6], &offsets));
  TRY(mm_describe(inputs[0], &A));
  TRY(mm_describe(inputs[1], &B));
  TRY(mm_describe(inputs[2], &S));
  if (inputs[3] != NULL) TRY(mm_describe(inputs[3], &Z));
  if (inputs[5] != NULL) {
    TRY(mm_describe(inputs[5], &bias));
    if (bias.count != m->N) return fail("MatMulNBits (engine.kernels): bias must have N values");
  }
  if (A.rank < 1 || A.dims[A.rank - 1] != m->K) return fail("MatMulNBits (engine.kernels): A's last axis must be K");
  TRY(ensure_repacked(m, &B, &S, inputs[3] != NULL ? &Z : NULL, inputs[6] != NULL ? &offsets : NULL));
  int64_t out_dims[8];
  memcpy(out_dims, A.dims, A.rank * sizeof(int64_t));
  out_dims[A.rank - 1] = m->N;
  OrtValue* output = NULL;
  TRY(API(KernelContext_GetOutput)(context, 0, out_dims, A.rank, &output));
  float* y = NULL;
  TRY(API(GetTensorMutableData)(output, (void**)&y));
  const int64_t M = A.count / m->K;
  if (M == 0) return NULL;
  Rows r = {M, m->K, m->blocks * m->block, (const float*)A.data, NULL, NULL, NULL, NULL, NULL};
  const int int8 = m->accuracy == 4;
  void* buffer;
  float* sums = m->offsets != NULL ? (float*)malloc((size_t)(M * m->blocks) * sizeof(float)) : NULL;
  if (int8) {
    buffer = malloc((size_t)(M * r.Kp) + (size_t)(M * m->blocks) * (sizeof(float) + sizeof(int32_t)) + 64);
    if (buffer != NULL) {
      r.sa = (float*)buffer;
      r.asum = (int32_t*)(r.sa + M * m->blocks);
      r.qa = (int8_t*)(r.asum + M * m->blocks);
#ifdef HAVE_X86_PATHS
      if (g_mm_isa == 1)
        quantize_rows_avx512(m, &r);
      else
#endif
        quantize_rows(m, &r);
    }
  } else {
    buffer = malloc((size_t)(M * r.Kp) * sizeof(float));
    if (buffer != NULL) {
      r.af = (float*)buffer;
      pad_rows(m, &r);
    }
  }
  if (m->offsets != NULL && sums == NULL) {
    free(buffer);
    buffer = NULL;
  }
  if (sums != NULL) {
    r.bsum = sums;
    block_sums(m, &r);
  }
  if (buffer == NULL) {
    free(sums);
    return API(CreateStatus)(ORT_FAIL, "MatMulNBits (engine.kernels): out of memory");
  }
  Job job = {m, &r, inputs[5] != NULL ? (const float*)bias.data : NULL, y};
  OrtStatus* status = engine_parallel(context, run_group, (size_t)m->groups, &job, M <= 8);
  free(buffer);
  free(sums);
  return status;
}

static CustomOp g_mm_op;

/* "avx512-vnni", "avx2: <why>" or "portable: <why>": what the matmul runs on this CPU
   (ONNX_GENAI_KERNELS=avx2 or =portable picks the others, for the tests). */
const char* engine_matmul_paths(void) {
#ifdef HAVE_X86_PATHS
  __builtin_cpu_init();
  const char* choice = getenv("ONNX_GENAI_KERNELS");
  if (choice != NULL && strcmp(choice, "portable") == 0) return "portable: ONNX_GENAI_KERNELS=portable";
  const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (choice != NULL && strcmp(choice, "avx2") == 0 && avx2) return "avx2: ONNX_GENAI_KERNELS=avx2";
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
    return "avx512-vnni";
  if (avx2) return "avx2: this CPU lacks AVX-512 VNNI";
  return "portable: this CPU lacks AVX2";
#else
  return "portable: built without the x86-64 vector code";
#endif
}

/* Adds MatMulNBits to the engine's domain (RegisterCustomOps, decode_attention.c). */
OrtStatus* engine_matmul_register(OrtCustomOpDomain* domain) {
  const char* paths = engine_matmul_paths();
  g_mm_isa = strcmp(paths, "avx512-vnni") == 0 ? 1 : strncmp(paths, "avx2", 4) == 0 ? 2 : 0;
  g_mm_op.version = OP_VERSION;
  g_mm_op.CreateKernel = NULL;
  g_mm_op.GetName = mm_name;
  g_mm_op.GetExecutionProviderType = mm_provider;
  g_mm_op.GetInputType = mm_input_type;
  g_mm_op.GetInputTypeCount = mm_input_count;
  g_mm_op.GetOutputType = mm_output_type;
  g_mm_op.GetOutputTypeCount = mm_output_count;
  g_mm_op.KernelCompute = mm_compute_v1;
  g_mm_op.KernelDestroy = mm_destroy;
  g_mm_op.GetInputCharacteristic = mm_input_characteristic;
  g_mm_op.GetOutputCharacteristic = mm_output_characteristic;
  g_mm_op.GetInputMemoryType = mm_memory_type;
  g_mm_op.GetVariadicInputMinArity = mm_arity;
  g_mm_op.GetVariadicInputHomogeneity = mm_homogeneity;
  g_mm_op.GetVariadicOutputMinArity = mm_arity;
  g_mm_op.GetVariadicOutputHomogeneity = mm_homogeneity;
  g_mm_op.CreateKernelV2 = mm_create;
  g_mm_op.KernelComputeV2 = mm_compute;
  return API(CustomOpDomain_Add)(domain, &g_mm_op);
}
