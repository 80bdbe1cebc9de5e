/*
 * GroupQueryAttention for ONNX Runtime's CPU provider, with a decode step of our own.
 *
 * The operator `engine.kernels::GroupQueryAttention` takes the inputs, outputs and
 * attributes of `com.microsoft::GroupQueryAttention`. When a run adds one token per
 * sequence to a KV cache that past and present share (the engine's decode steps), it
 * computes the step here; every other run (a prefill, a speculative check, a cache that
 * is not shared, an attribute or input this code does not handle) is handed to ONNX
 * Runtime's own kernel through `InvokeOp`, so results there are ONNX Runtime's.
 *
 * Why: ONNX Runtime's CPU kernel multiplies each query head by the whole cache of its KV
 * head on its own (a GEMM per head that packs the keys first), so a cache shared by three
 * query heads is read and packed three times, and the work is split by head only. Here
 * the query heads of a KV head go through its keys and values together, in one pass, and
 * the positions are split into chunks that the session's own threads share (split-K, the
 * chunks' softmax partials combined at the end): every byte of the cache is read once.
 *
 * `engine.kernels::GroupQueryAttentionF16KV` is the same operator over a float16 cache
 * (past_key, past_value, present_key, present_value in float16; query, key, value, the
 * output and the rotary caches in float32): each new key (after rotary) and value is
 * rounded to float16 (to nearest, ties to even) and written to the cache first, and every
 * read of the cache, a chunk's own new tokens included, converts its float16 values to
 * float32 (exactly: F16C where the CPU has it, plain C otherwise, the same bits), so the
 * attention code and its bit-for-bit rule are the fp32 operator's. Half the cache memory,
 * half the bytes read a step. Shapes its own code does not cover go to ONNX Runtime's fp32
 * kernel on float32 copies of the caches (the present rounded back to float16).
 *
 * `engine.kernels::GroupQueryAttentionI16KV` keeps each cache row as int16 whole numbers and
 * their scale, and runs the attention on the whole numbers (the section "an int16 cache";
 * VPDPWSSD where the CPU has AVX-512 VNNI or AVX-VNNI): the engine's default KV on such CPUs.
 *
 * `engine.kernels::GroupQueryAttentionI8KV` keeps each cache row as int8 values and their
 * scale; where the CPU has AMX-BF16 its scores run on the tile unit (the AMX section).
 *
 * MatMulNBits (matmul_nbits.c) is registered in the same domain by RegisterCustomOps.
 *
 * The header of ONNX Runtime is not needed: the C API is a table of function pointers
 * whose order is fixed across releases (new entries are only appended), so the few this
 * file calls are named by their index (ort_api.h, shared with matmul_nbits.c).
 */
#include "ort_api.h"

/* ---- the operator's description (ONNX Runtime reads these through OrtCustomOp) --- */

/* GroupQueryAttention's first inputs: query, key, value, past_key, past_value, seqlens_k,
   total_sequence_length, cos_cache, sin_cache; its first outputs: output, present_key,
   present_value. (engine/model/graph_passes.py gives this operator only nodes that use no
   other input, output or attribute than those read here.) */
#define N_INPUTS 9
#define N_OUTPUTS 3
static const int INPUT_TYPES[N_INPUTS] = {ELEM_FLOAT, ELEM_FLOAT, ELEM_FLOAT, ELEM_FLOAT, ELEM_FLOAT,
                                          ELEM_INT32, ELEM_INT32, ELEM_FLOAT, ELEM_FLOAT};
static const int INPUT_TYPES_F16KV[N_INPUTS] = {ELEM_FLOAT, ELEM_FLOAT, ELEM_FLOAT, ELEM_FLOAT16, ELEM_FLOAT16,
                                               ELEM_INT32, ELEM_INT32, ELEM_FLOAT, ELEM_FLOAT};
static const int INPUT_TYPES_I8KV[N_INPUTS] = {ELEM_FLOAT, ELEM_FLOAT, ELEM_FLOAT, ELEM_INT8, ELEM_INT8,
                                              ELEM_INT32, ELEM_INT32, ELEM_FLOAT, ELEM_FLOAT};
static const int INPUT_TYPES_I16KV[N_INPUTS] = {ELEM_FLOAT, ELEM_FLOAT, ELEM_FLOAT, ELEM_INT16, ELEM_INT16,
                                               ELEM_INT32, ELEM_INT32, ELEM_FLOAT, ELEM_FLOAT};
static const int INPUT_REQUIRED_MASK[N_INPUTS] = {1, 0, 0, 0, 0, 1, 1, 0, 0};

/* The KV caches' element. KV_I8: a row of head_size int8 values, then its scale as a
   bfloat16 (head_size + 2 bytes: a quarter of float32's bytes, and a bit): value d is
   q[d] * scale, one multiply in float on every path. KV_I16: a row of head_size int16 whole
   numbers, then its scale as a bfloat16 (head_size + 1 int16; the section "an int16
   cache"). */
enum { KV_F32 = 0, KV_F16 = 1, KV_I8 = 2, KV_I16 = 3 };
#define I8_ROW(D) ((D) + 2)
#define I16_ROW(D) ((D) + 1)

typedef struct Kernel {
  int64_t num_heads, kv_num_heads, local_window_size, do_rotary, rotary_interleaved, smooth_softmax;
  float scale, softcap;
  int kind;        /* the caches' element: KV_F32, KV_F16 (GroupQueryAttentionF16KV), KV_I8 (...I8KV), KV_I16 */
  OrtOp* fallback; /* ONNX Runtime's own GroupQueryAttention (float32) */
} Kernel;

static CustomOp g_op, g_op_f16, g_op_i8, g_op_i16; /* the operators' tables (RegisterCustomOps fills them) */

/* The caches' element an operator's table stands for. */
static int op_kind(const void* op) {
  return op == (const void*)&g_op_f16   ? KV_F16
         : op == (const void*)&g_op_i8  ? KV_I8
         : op == (const void*)&g_op_i16 ? KV_I16
                                        : KV_F32;
}

static const char* ORT_CALL op_name(const void* op) {
  static const char* const names[] = {"GroupQueryAttention", "GroupQueryAttentionF16KV", "GroupQueryAttentionI8KV",
                                      "GroupQueryAttentionI16KV"};
  return names[op_kind(op)];
}
static const char* ORT_CALL op_provider(const void* op) { (void)op; return "CPUExecutionProvider"; }
static int ORT_CALL input_type(const void* op, size_t i) {
  static const int* const types[] = {INPUT_TYPES, INPUT_TYPES_F16KV, INPUT_TYPES_I8KV, INPUT_TYPES_I16KV};
  return types[op_kind(op)][i];
}
static size_t ORT_CALL input_count(const void* op) { (void)op; return N_INPUTS; }
static int ORT_CALL output_type(const void* op, size_t i) {
  static const int caches[] = {ELEM_FLOAT, ELEM_FLOAT16, ELEM_INT8, ELEM_INT16};
  return i == 0 ? ELEM_FLOAT : caches[op_kind(op)];
}
static size_t ORT_CALL output_count(const void* op) { (void)op; return N_OUTPUTS; }
static int ORT_CALL input_characteristic(const void* op, size_t i) {
  (void)op;
  return INPUT_REQUIRED_MASK[i] ? INPUT_REQUIRED : INPUT_OPTIONAL;
}
static int ORT_CALL output_characteristic(const void* op, size_t i) {
  (void)op;
  return i == 0 ? INPUT_REQUIRED : INPUT_OPTIONAL;
}
static int ORT_CALL input_memory_type(const void* op, size_t i) { (void)op; (void)i; return 0; }
static int ORT_CALL variadic_arity(const void* op) { (void)op; return 1; }
static int ORT_CALL variadic_homogeneity(const void* op) { (void)op; return 1; }
static void ORT_CALL kernel_compute_v1(void* kernel, OrtKernelContext* context) { (void)kernel; (void)context; }

static void ORT_CALL kernel_destroy(void* p) {
  Kernel* kernel = (Kernel*)p;
  if (kernel == NULL) return;
  if (kernel->fallback != NULL) API(ReleaseOp)(kernel->fallback);
  free(kernel);
}

static float attr_float(const OrtKernelInfo* info, const char* name, float fallback) {
  float value = fallback;
  OrtStatus* status = API(KernelInfoGetAttribute_float)(info, name, &value);
  if (status != NULL) {
    API(ReleaseStatus)(status);
    return fallback;
  }
  return value;
}

static OrtStatus* make_fallback(const OrtKernelInfo* info, Kernel* k) {
  const char* names[] = {"num_heads", "kv_num_heads", "local_window_size", "do_rotary",
                         "rotary_interleaved", "smooth_softmax"};
  int64_t ints[] = {k->num_heads, k->kv_num_heads, k->local_window_size, k->do_rotary,
                    k->rotary_interleaved, k->smooth_softmax};
  OrtOpAttr* attrs[8] = {0};
  int n = 0;
  OrtStatus* status = NULL;
  for (int i = 0; i < 6 && status == NULL; ++i) {
    status = API(CreateOpAttr)(names[i], &ints[i], 1, OP_ATTR_INT, &attrs[n]);
    if (status == NULL) ++n;
  }
  if (status == NULL) {
    status = API(CreateOpAttr)("scale", &k->scale, 1, OP_ATTR_FLOAT, &attrs[n]);
    if (status == NULL) ++n;
  }
  if (status == NULL) {
    status = API(CreateOpAttr)("softcap", &k->softcap, 1, OP_ATTR_FLOAT, &attrs[n]);
    if (status == NULL) ++n;
  }
  if (status == NULL) {
    const char* constraint_names[] = {"T", "M"};
    const int constraint_types[] = {ELEM_FLOAT, ELEM_INT32};
    status = API(CreateOp)(info, "GroupQueryAttention", "com.microsoft", 1, constraint_names,
                           constraint_types, 2, (const OrtOpAttr* const*)attrs, n, N_INPUTS,
                           N_OUTPUTS, &k->fallback);
  }
  for (int i = 0; i < n; ++i) API(ReleaseOpAttr)(attrs[i]);
  return status;
}

static OrtStatus* ORT_CALL kernel_create(const void* op, const void* api, const OrtKernelInfo* info,
                                         void** out) {
  (void)api;
  Kernel* k = (Kernel*)calloc(1, sizeof(Kernel));
  if (k == NULL) return API(CreateStatus)(ORT_FAIL, "out of memory");
  k->kind = op_kind(op);
  k->num_heads = attr_int(info, "num_heads", 0);
  k->kv_num_heads = attr_int(info, "kv_num_heads", 0);
  k->local_window_size = attr_int(info, "local_window_size", -1);
  k->do_rotary = attr_int(info, "do_rotary", 0);
  k->rotary_interleaved = attr_int(info, "rotary_interleaved", 0);
  k->smooth_softmax = attr_int(info, "smooth_softmax", 0);
  k->scale = attr_float(info, "scale", 0.0f);
  k->softcap = attr_float(info, "softcap", 0.0f);
  if (k->num_heads <= 0 || k->kv_num_heads <= 0 || k->num_heads % k->kv_num_heads != 0) {
    free(k);
    return fail("GroupQueryAttention: num_heads must be a positive multiple of kv_num_heads");
  }
  OrtStatus* status = make_fallback(info, k);
  if (status != NULL) {
    free(k);
    return status;
  }
  *out = k;
  return NULL;
}

/* ---- the decode step ------------------------------------------------------------ */

#define CHUNK 512   /* positions per task */
/* Most query vectors one call of attend takes (its maxima and sums on the stack). */
#define MAX_VECTORS 256
#define MAX_HEAD 256

typedef struct Step {
  int64_t rows, heads, kv_heads, group, head_size, capacity, chunks;
  int64_t seq;             /* new tokens per batch row: row r is token r % seq of batch r / seq */
  const int32_t* totals;   /* [rows]: the positions row r attends to, itself included */
  const float* q;          /* [rows, heads, head_size], rotated and scaled */
  const void* keys;        /* [batch, kv_heads, capacity, head_size]: float, float16 or int8 rows (kind) */
  const void* values;
  float* partial;          /* chunk tasks: [rows, heads, chunks, head_size + 2]: acc..., max, sum */
  float* out;              /* row tasks: [rows, heads, head_size] */
  volatile int failed;     /* a row task could not get its scratch memory */
  int kind;                /* KV_F32, KV_F16 (uint16_t bits), KV_I8 (I8_ROW bytes a row) */
  int64_t window;          /* local_window_size: a row attends its last `window` positions (<= 0: all) */
  int64_t block;           /* row tasks: rows a task (row_block) */
} Step;

/* The first position row r attends to: a sliding window's start, as ONNX Runtime's kernel
   has it (the row's own position and the window - 1 before it); 0 without one. */
#define ROW_FIRST(s, r) \
  ((s)->window > 0 && (int64_t)(s)->totals[r] > (s)->window ? (int64_t)(s)->totals[r] - (s)->window : 0)

/* exp(x) for x <= 0 to about 2 ulp, written so the compiler vectorises a loop around it
   (no floorf: n is rounded with the 1.5 * 2^23 trick; 2^n is built from its bits). */
static inline float exp_neg(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union {
    int32_t i;
    float f;
  } scale;
  scale.i = ((int32_t)n + 127) << 23;
  return p * scale.f;
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86_PATHS 1

/* Four dot products reduced together: three horizontal adds and one add give the four
   sums in one register, instead of a shuffle tree per key. */
__attribute__((target("avx2,fma"))) static inline __m128 sum4_ymm(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* scores[t] = q . K[t] for t < n, D a multiple of 8 (AVX2 and FMA). */
__attribute__((target("avx2,fma"))) static void dots_avx2(const float* q, const float* K, int64_t n, int64_t D,
                                                          float* scores) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* k = K + t * D;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + d), a0);
      a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + D + d), a1);
      a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 2 * D + d), a2);
      a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 3 * D + d), a3);
    }
    _mm_storeu_ps(scores + t, sum4_ymm(a0, a1, a2, a3));
  }
  for (; t < n; ++t) {
    const float* k = K + t * D;
    __m256 a0 = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    const __m128 r = sum4_ymm(a0, a0, a0, a0);
    scores[t] = _mm_cvtss_f32(r);
  }
}



/* t[i] <- column i of the 16 x 16 block whose rows are r[0..15] (r may alias t). */
__attribute__((target("avx512f"))) static inline void transpose16(const __m512* r, __m512* t) {
  __m512 a[16], b[16];
  for (int i = 0; i < 16; i += 2) { /* pairs of rows: elements interleaved */
    a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) { /* then pairs of elements */
    b[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a[i]), _mm512_castps_pd(a[i + 2])));
    b[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a[i]), _mm512_castps_pd(a[i + 2])));
    b[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a[i + 1]), _mm512_castps_pd(a[i + 3])));
    b[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a[i + 1]), _mm512_castps_pd(a[i + 3])));
  }
  /* b[4k + c] holds, in 128-bit lane L, elements 4L + c of rows 4k..4k+3 */
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88), x1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xDD);
    const __m512 y0 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88),
                 y1 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xDD);
    t[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);      /* column c */
    t[4 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);  /* column 4 + c */
    t[8 + c] = _mm512_shuffle_f32x4(x0, y0, 0xDD);  /* column 8 + c */
    t[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xDD); /* column 12 + c */
  }
}

/* The index vectors of pairs_in_order's transposition: stage 1 picks, from two registers
   of two 8-column rows each, 4 rows by columns 4h..4h+3 (lane 4 * row + column); stage 2,
   from two such, 8 rows by columns 2h, 2h + 1 (lane 2 * row + column); stage 3, from two
   such, 16 rows by column h (lane = row). */
__attribute__((target("avx512f"))) static inline __m512i pick_index(int stage, int h) {
  int32_t at[16];
  for (int lane = 0; lane < 16; ++lane) {
    const int cols = stage == 1 ? 4 : stage == 2 ? 2 : 1, in_cols = stage == 1 ? 8 : stage == 2 ? 4 : 2;
    const int rows = 16 / cols, row = lane / cols, col = lane % cols + cols * h;
    const int second = row >= rows / 2, r = second ? row - rows / 2 : row;
    at[lane] = 16 * second + r * in_cols + col;
  }
  return _mm512_loadu_si512(at);
}

/* The dot products of sixteen keys at once in AVX-512: a[j] holds key j's sixteen lane
   sums (lane l: dimension l's product, then those of l + 16, l + 32, ... added in order),
   and key j's dot product is the sum, in order, of its eight pairs of lanes: ((p0 + p1) +
   p2) + ... + p7, p_c = lane c + lane c + 8. The pairs of all sixteen keys come from eight
   adds (each serving two keys), then a transposition in three stages of two-register
   permutes puts pair c of every key in one register, and seven adds finish: lane j of
   the result is key j's dot product. (An order that dots_t16 follows with three registers
   a sum: see there.) */
__attribute__((target("avx512f"))) static inline __m512 pairs_in_order(const __m512* a) {
  __m512 b[8], s1[4][2], s2[2][2][2];
  for (int i = 0; i < 8; ++i) /* [key 2i: p0..p7 | key 2i+1: p0..p7] */
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i) /* keys 4i..4i+3 by pairs 4h..4h+3 */
    for (int h = 0; h < 2; ++h) s1[i][h] = _mm512_permutex2var_ps(b[2 * i], pick_index(1, h), b[2 * i + 1]);
  for (int j = 0; j < 2; ++j) /* keys 8j..8j+7 by pairs 4h + 2h2, +1 */
    for (int h = 0; h < 2; ++h)
      for (int h2 = 0; h2 < 2; ++h2)
        s2[j][h][h2] = _mm512_permutex2var_ps(s1[2 * j][h], pick_index(2, h2), s1[2 * j + 1][h]);
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < 8; ++c) { /* pair c of the sixteen keys, added in order */
    const __m512 pc = _mm512_permutex2var_ps(s2[0][c / 4][(c / 2) % 2], pick_index(3, c % 2), s2[1][c / 4][(c / 2) % 2]);
    sum = c == 0 ? pc : _mm512_add_ps(sum, pc);
  }
  return sum;
}

/* scores[t] = q . K[t] for t < n, D a multiple of 16 (AVX-512): sixteen keys at a time,
   each key's lanes summed over its dimensions in order (a multiply, then multiply-adds),
   then pairs_in_order. A key's dot product has the same bits whichever keys are computed
   with it (a short last group leaves the missing keys' lanes at zero). */
__attribute__((target("avx512f"))) static void dots_avx512(const float* q, const float* K, int64_t n,
                                                           int64_t D, float* scores) {
  __m512 a[16];
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    const float* k = K + t * D;
    const __m512 q0 = _mm512_loadu_ps(q);
    for (int j = 0; j < 16; ++j) a[j] = _mm512_mul_ps(q0, _mm512_loadu_ps(k + j * D));
    for (int64_t d = 16; d < D; d += 16) {
      const __m512 qd = _mm512_loadu_ps(q + d);
      for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + j * D + d), a[j]);
    }
    _mm512_storeu_ps(scores + t, pairs_in_order(a));
  }
  if (t < n) {
    const int64_t m = n - t;
    const float* k = K + t * D;
    const __m512 q0 = _mm512_loadu_ps(q);
    for (int j = 0; j < 16; ++j) a[j] = j < m ? _mm512_mul_ps(q0, _mm512_loadu_ps(k + j * D)) : _mm512_setzero_ps();
    for (int64_t d = 16; d < D; d += 16) {
      const __m512 qd = _mm512_loadu_ps(q + d);
      for (int j = 0; j < 16; ++j)
        if (j < m) a[j] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + j * D + d), a[j]);
    }
    _mm512_mask_storeu_ps(scores + t, (__mmask16)((1u << m) - 1u), pairs_in_order(a));
  }
}
#endif

/* 2: the dot products in AVX-512, 1: in AVX2 and FMA, 0: in portable C (set at
   registration from the CPU; ONNX_GENAI_KERNELS=portable forces 0 and =avx2 at most 1,
   for the tests). A token's attention has the same bits on every path of one machine. */
static int g_isa;
/* How float16 is read: 2 AVX-512, 1 F16C, 0 plain C (exact conversions all: the same bits). */
static int g_half;

/* ---- float16 (IEEE binary16) ------------------------------------------------------- */

/* A float16's value as a float (exact; a signalling NaN comes back quiet, as from F16C).
   Without branches, so that a loop of it vectorises (the plain C path): a normal number
   is its bits moved up with the exponent rebiased; a subnormal m * 2^-24 is
   2^-14 * (1 + m / 1024) - 2^-14, computed exactly in float. */
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
  /* all ones where true (masks, not branches: the loop stays vectorisable) */
  const uint32_t is_sub = 0u - (uint32_t)(em < 0x400u), is_special = 0u - (uint32_t)(em >= 0x7c00u);
  const uint32_t is_nan = 0u - (uint32_t)(em > 0x7c00u);
  const uint32_t normal = ((em << 13) + 0x38000000u + (is_special & 0x38000000u)) | (is_nan & 0x400000u);
  const uint32_t scaled_bits = (em << 13) + 0x38800000u;
  float scaled, subnormal;
  memcpy(&scaled, &scaled_bits, sizeof scaled);
  subnormal = scaled - 6.103515625e-05f; /* 2^-14 */
  uint32_t sub_bits;
  memcpy(&sub_bits, &subnormal, sizeof sub_bits);
  const uint32_t bits = (sub_bits & is_sub) | (normal & ~is_sub) | sign;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* The float16 nearest to f (ties to even; beyond the largest float16, infinity), as
   numpy's astype(float16) and F16C's round-to-nearest give it. */
static inline uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* infinity, or NaN (kept quiet, its payload's top bits) */
    return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds to infinity */
  if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
    if (ax <= 0x33000000u) return sign;                     /* <= 2^-25: rounds to zero */
    const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return (uint16_t)(sign | q);
  }
  uint32_t h = (ax - 0x38000000u) >> 13; /* exponent rebiased, mantissa cut to 10 bits */
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h; /* a carry moves the exponent up */
  return (uint16_t)(sign | h);
}

#ifdef HAVE_X86_PATHS
__attribute__((target("avx512f"))) static void halves_avx512(const uint16_t* h, int64_t n, float* f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(f + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(h + i))));
  for (; i < n; ++i) f[i] = half_to_float(h[i]);
}

__attribute__((target("avx,f16c"))) static void halves_f16c(const uint16_t* h, int64_t n, float* f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i))));
  for (; i < n; ++i) f[i] = half_to_float(h[i]);
}

/* The same rounding as float_to_half (to nearest, ties to even; NaN kept quiet). */
__attribute__((target("avx512f"))) static void floats_avx512(const float* f, int64_t n, uint16_t* h) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(h + i), _mm512_cvtps_ph(_mm512_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) h[i] = float_to_half(f[i]);
}

__attribute__((target("avx,f16c"))) static void floats_f16c(const float* f, int64_t n, uint16_t* h) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) h[i] = float_to_half(f[i]);
}
#endif

/* h[i] = float_to_half(f[i]), for i < n. */
static void floats_to_halves(const float* f, int64_t n, uint16_t* h) {
#ifdef HAVE_X86_PATHS
  if (g_half == 2) {
    floats_avx512(f, n, h);
    return;
  }
  if (g_half == 1) {
    floats_f16c(f, n, h);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) h[i] = float_to_half(f[i]);
}

/* f[i] = the float16 h[i] as a float, for i < n (the plain C loop compiled for the wider
   vector units too: HOT). */
HOT static void halves_to_floats(const uint16_t* h, int64_t n, float* f) {
#ifdef HAVE_X86_PATHS
  if (g_half == 2) {
    halves_avx512(h, n, f);
    return;
  }
  if (g_half == 1) {
    halves_f16c(h, n, f);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) f[i] = half_to_float(h[i]);
}

/* The bfloat16 at p (any alignment) as a float: exact. */
static inline float bf16_at(const void* p) {
  uint16_t bits;
  memcpy(&bits, p, sizeof bits);
  const uint32_t wide = (uint32_t)bits << 16;
  float value;
  memcpy(&value, &wide, sizeof value);
  return value;
}

/* An int8 row's scale (the bfloat16 after its D values). */
static inline float i8_scale(const int8_t* row, int64_t D) { return bf16_at(row + D); }

/* f[i * D + d] = row i's value d as a float, for `rows` int8 rows of I8_ROW(D) bytes at src:
   q * scale, the one multiply every path makes. HOT: vectorised where the CPU can. */
HOT static void i8_rows_to_floats(const int8_t* src, int64_t rows, int64_t D, float* f) {
  for (int64_t i = 0; i < rows; ++i) {
    const int8_t* row = src + i * I8_ROW(D);
    const float scale = i8_scale(row, D);
    for (int64_t d = 0; d < D; ++d) f[i * D + d] = (float)row[d] * scale;
  }
}

/* A new key or value row into int8: scale = largest |x| / 127 rounded to the nearest
   bfloat16 (within 2^-8 of it), q = x / scale rounded to nearest (ties to even) and kept
   within +-127 (the largest value then lands on 126 or 127, within half a step); an
   all-zero row keeps scale 0. (Rounding the scale up instead, so nothing clips, made every
   step larger and the answers no closer: bench.kv_dtype on the fp32 export parted at
   tokens 27 and 0 against 27 and 46.) */
static void floats_to_i8_row(const float* x, int64_t D, int8_t* row) {
  float top = 0.0f;
  for (int64_t d = 0; d < D; ++d) top = fabsf(x[d]) > top ? fabsf(x[d]) : top;
  const float exact = top / 127.0f;
  uint32_t wide;
  memcpy(&wide, &exact, sizeof wide);
  if ((wide & 0x7F800000u) != 0x7F800000u) wide += 0x7FFFu + ((wide >> 16) & 1u); /* nearest, ties to even */
  const uint16_t bits = (uint16_t)(wide >> 16);
  memcpy(row + D, &bits, sizeof bits);
  const float scale = i8_scale(row, D);
  for (int64_t d = 0; d < D; ++d) {
    const float v = scale > 0.0f ? nearbyintf(x[d] / scale) : 0.0f;
    row[d] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
  }
}

/* Sum of 16 lanes as a tree (the compiler keeps it in vector registers). */
static inline float sum16(const float* lanes) {
  float t8[8], t4[4];
  for (int l = 0; l < 8; ++l) t8[l] = lanes[l] + lanes[l + 8];
  for (int l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

#ifdef HAVE_X86_PATHS
__attribute__((target("avx512f"))) static float largest_avx512(const float* x, int64_t n) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  int64_t t = 0;
  for (; t + 32 <= n; t += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + t));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + t + 16));
  }
  for (; t < n; t += 16) {
    const __mmask16 keep = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1u);
    m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), keep, x + t));
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}
#endif

/* Keys per tile: a tile's keys or values (TILE x head_size floats) stay in the core's
   first-level cache while every query vector of the block goes over them. */
#define TILE 64

/* ---- an int16 cache (GroupQueryAttentionI16KV) -----------------------------------------

   A cache row (one token, one KV head): head_size whole numbers q, then the row's scale
   as a bfloat16, head_size + 1 int16 (1.6% more than float16's at 64). Value d is q[d] * scale,
   exact in float32 (a whole number of 13 bits times an 8-bit significand). The attention
   runs on the whole numbers as the float16 cache's int16 path does (the section "in int16
   whole numbers"), with the rows' conversion done once, when a row is written, instead of
   at every read: a score is ((float)(q . k, exact in int32) * q's scale) * k's scale, and a
   tile's weighted values (TILE positions at fixed places) sum exactly in int32 before one
   multiply-add into the float total. Integer sums are exact in any order, so every path
   (VPDPWSSD where the CPU has AVX-512 VNNI or AVX-VNNI, plain C otherwise) gives the same
   bits. */

/* The largest M with D * M * M < 2^31 (the products' sum of a row then fits int32). */
static int64_t i16_limit(int64_t D) {
  int64_t m = (int64_t)sqrt(2147483647.0 / (double)D);
  while (D * (m + 1) * (m + 1) <= 2147483647) ++m;
  while (D * m * m > 2147483647) --m;
  return m;
}

/* The largest |q| of an int16 cache's row: a score's D products and a tile's TILE weighted
   values then both sum exactly in int32 (5,792 for heads of 64 or less, 4,095 for 128). */
static inline int64_t i16_row_limit(int64_t D) { return i16_limit(D > TILE ? D : TILE); }

/* An int16 row's scale (the bfloat16 after its D whole numbers). */
static inline float i16_row_scale(const int16_t* row, int64_t D) { return bf16_at(row + D); }

/* A new key or value row into the int16 cache: scale = largest |x| / M rounded up to a
   bfloat16, q = x / scale rounded to nearest (ties to even). Rounding up leaves no value
   past M (the int8 rows round to nearest and clip instead: with 127 steps that was the
   better trade; with M steps the clipped largest value would be off by up to 11 of them).
   An all-zero row keeps scale 0; NaN values become 0; a row holding inf gets an infinite
   scale and reads back as NaN (as attention over a float16 cache holding inf gives NaN:
   a broken model shows, it is not hidden). HOT: the roundings
   in vector instructions where the CPU has them (exact, so the same whole numbers). */
HOT static void floats_to_i16_row(const float* x, int64_t D, int16_t* row) {
  const float M = (float)i16_row_limit(D);
  float top = 0.0f;
  for (int64_t d = 0; d < D; ++d) top = fabsf(x[d]) > top ? fabsf(x[d]) : top;
  const float exact = top / M;
  uint32_t wide;
  memcpy(&wide, &exact, sizeof wide);
  if ((wide & 0x7F800000u) != 0x7F800000u) wide += 0xFFFFu; /* up: exact is >= 0 */
  const uint16_t bits = (uint16_t)(wide >> 16);
  memcpy(row + D, &bits, sizeof bits);
  const float scale = i16_row_scale(row, D);
  for (int64_t d = 0; d < D; ++d) {
    const float v = scale > 0.0f ? nearbyintf(x[d] / scale) : 0.0f;
    row[d] = (int16_t)(v > M ? M : v < -M ? -M : v == v ? v : 0.0f);
  }
}

/* f[i * D + d] = row i's value d as a float (exact), for `rows` int16 rows at src. */
HOT static void i16_rows_to_floats(const int16_t* src, int64_t rows, int64_t D, float* f) {
  for (int64_t i = 0; i < rows; ++i) {
    const int16_t* row = src + i * I16_ROW(D);
    const float scale = i16_row_scale(row, D);
    for (int64_t d = 0; d < D; ++d) f[i * D + d] = (float)row[d] * scale;
  }
}

/* `rows` rows (one token and KV head each) of a float16, int8 or int16 cache at src as
   floats, f[i * D + d], as every path reads them. */
static inline void cache_rows_to_floats(int kind, const void* src, int64_t rows, int64_t D, float* f) {
  if (kind == KV_I8)
    i8_rows_to_floats((const int8_t*)src, rows, D, f);
  else if (kind == KV_I16)
    i16_rows_to_floats((const int16_t*)src, rows, D, f);
  else
    halves_to_floats((const uint16_t*)src, rows * D, f);
}

/* Row `row` of a float16, int8 or int16 cache at base (one token and KV head). */
static inline void* cache_row(int kind, void* base, int64_t row, int64_t D) {
  return (char*)base + row * (kind == KV_I8 ? I8_ROW(D) : kind == KV_I16 ? 2 * I16_ROW(D) : 2 * D);
}

/* `rows` rows of D floats at x into a float16, int8 or int16 cache at dst: rounded to
   float16, or quantized row by row. */
static void floats_to_cache_rows(int kind, const float* x, int64_t rows, int64_t D, void* dst) {
  if (kind == KV_I8)
    for (int64_t r = 0; r < rows; ++r) floats_to_i8_row(x + r * D, D, (int8_t*)dst + r * I8_ROW(D));
  else if (kind == KV_I16)
    for (int64_t r = 0; r < rows; ++r) floats_to_i16_row(x + r * D, D, (int16_t*)dst + r * I16_ROW(D));
  else
    floats_to_halves(x, rows * D, (uint16_t*)dst);
}

/* M / largest, the factor that makes a vector's largest |x| M: 0 for a vector of zeros,
   and 0 too where it would overflow (a largest |x| below about 1e-35, a tile of weights
   ~80 below its chunk's top score: they weigh nothing then, on every path alike). */
static inline float i16_factor(float M, float largest) {
  const float inv = largest > 0.0f ? M / largest : 0.0f;
  return inv <= 3.4e38f ? inv : 0.0f;
}

/* A query vector as whole numbers for an int16 cache: out[d] = q[d] * M / its largest |x|
   rounded to nearest even (M = i16_limit(D)); returns its scale, largest / M. Every path
   quantizes its queries here (HOT: as floats_to_i16_row). */
HOT static float i16_query_rows(const float* q, int64_t D, float M, int16_t* out) {
  float m = 0.0f;
  for (int64_t d = 0; d < D; ++d) m = fabsf(q[d]) > m ? fabsf(q[d]) : m;
  const float inv = i16_factor(M, m);
  for (int64_t d = 0; d < D; ++d) out[d] = (int16_t)nearbyintf(q[d] * inv);
  return m / M;
}

/* scores[t] = ((float)(q . key t, exact) * sq) * key t's scale for t < n, the keys int16
   rows at K (the plain C path; the VNNI one computes the same numbers: i16_dots). */
static ALWAYS_INLINE void i16_row_dots(const int16_t* q, float sq, const int16_t* K, int64_t n, const int64_t D,
                                       float* scores) {
  for (int64_t t = 0; t < n; ++t) {
    const int16_t* k = K + t * I16_ROW(D);
    int32_t sum = 0;
    for (int64_t d = 0; d < D; ++d) sum += (int32_t)q[d] * (int32_t)k[d];
    scores[t] = ((float)sum * sq) * i16_row_scale(k, D);
  }
}

/* One query vector's weighted values over a tile of an int16 cache (the plain C path of
   i16_weights and i16_weigh): w[t] = p[t] * value t's scale for t < m, as whole numbers
   whose largest is i16_limit(TILE) (nearest even); acc[d] += (float)(sum of w[t] * value
   t's q[d], exact) * the weights' scale, one multiply-add. */
static ALWAYS_INLINE void i16_row_weigh(const float* p, const int16_t* V, int64_t m, const int64_t D, float* acc) {
  const float Mt = (float)i16_limit(TILE);
  float w[TILE];
  float most = 0.0f;
  for (int64_t t = 0; t < m; ++t) {
    w[t] = p[t] * i16_row_scale(V + t * I16_ROW(D), D);
    most = fabsf(w[t]) > most ? fabsf(w[t]) : most;
  }
  const float inv = i16_factor(Mt, most);
  int32_t sum[MAX_HEAD];
  for (int64_t d = 0; d < D; ++d) sum[d] = 0;
  for (int64_t t = 0; t < m; ++t) {
    const float r = nearbyintf(w[t] * inv);
    const int32_t wt = r == r ? (int32_t)r : 0; /* NaN (a malformed row): 0, as VPMOVDW leaves it */
    const int16_t* v = V + t * I16_ROW(D);
    for (int64_t d = 0; d < D; ++d) sum[d] += wt * (int32_t)v[d];
  }
  const float sw = most / Mt;
  for (int64_t d = 0; d < D; ++d) acc[d] = fmaf((float)sum[d], sw, acc[d]);
}

#ifdef HAVE_X86_PATHS
/* Query vectors reading one tile from which the transposed path (dots_t16) pays: below,
   transposing the tile costs more than the reductions it saves. */
#define TRANSPOSED_FROM 12

/* Kt[d * TILE + t] = key t's dimension d for t < m (keys at src: m rows of D floats, of D
   float16, or int8 rows, by kind), and 0 for the rest of the 2 or 4 groups of sixteen
   dots_t16 reads. */
__attribute__((target("avx512f"))) static void transpose_tile(const void* src, int kind, int64_t m, int64_t D,
                                                             float* Kt) {
  __m512 r[16];
  const int64_t padded = m > 2 * 16 ? TILE : 2 * 16; /* dots_t16 reads 2 or 4 groups */
  for (int64_t k0 = 0; k0 < padded; k0 += 16)
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      for (int64_t i = 0; i < 16; ++i) {
        if (k0 + i >= m) {
          r[i] = _mm512_setzero_ps();
        } else if (kind == KV_F16) {
          r[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)src + (k0 + i) * D + d0)));
        } else if (kind == KV_I8) {
          const int8_t* row = (const int8_t*)src + (k0 + i) * I8_ROW(D);
          const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(row + d0))));
          r[i] = _mm512_mul_ps(q, _mm512_set1_ps(i8_scale(row, D)));
        } else {
          r[i] = _mm512_loadu_ps((const float*)src + (k0 + i) * D + d0);
        }
      }
      transpose16(r, r);
      for (int64_t i = 0; i < 16; ++i) _mm512_storeu_ps(Kt + (d0 + i) * TILE + k0, r[i]);
    }
}

/* Lane l's sums of four queries by two groups of sixteen keys (at Kt and Kt + 16), into
   acc[i * 2 + g]: dimension l's product, then l + 16's, ... added in order. */
__attribute__((target("avx512f"))) static ALWAYS_INLINE void lane_sums(const float* const* qx, const float* Kt,
                                                                     int64_t l, __m512* acc, const int64_t D) {
  {
    const __m512 k0 = _mm512_loadu_ps(Kt + l * TILE), k1 = _mm512_loadu_ps(Kt + l * TILE + 16);
    for (int i = 0; i < 4; ++i) {
      const __m512 b = _mm512_set1_ps(qx[i][l]);
      acc[2 * i] = _mm512_mul_ps(b, k0);
      acc[2 * i + 1] = _mm512_mul_ps(b, k1);
    }
  }
  _Pragma("GCC unroll 16") for (int64_t j = 1; j < D / 16; ++j) {
    const int64_t d = 16 * j + l;
    const __m512 k0 = _mm512_loadu_ps(Kt + d * TILE), k1 = _mm512_loadu_ps(Kt + d * TILE + 16);
    for (int i = 0; i < 4; ++i) {
      const __m512 b = _mm512_set1_ps(qx[i][d]);
      acc[2 * i] = _mm512_fmadd_ps(b, k0, acc[2 * i]);
      acc[2 * i + 1] = _mm512_fmadd_ps(b, k1, acc[2 * i + 1]);
    }
  }
}

/* scores[x][16 y + i] = q_x . key 16 y + i of the transposed tile Kt, for x < nq and
   y < NG groups of sixteen keys: each dot product is dots_avx512's (lane l's sums over the
   dimensions l, l + 16, ... in order; then pair c = lane c + lane c + 8, and the pairs
   added in order), its lanes now sixteen keys of one query, so the pairs' sum is a
   running total. Four queries by two groups at a time: eight totals, eight lane sums and
   the pair's first half stay in registers (measured on Zen 5: 2.1 multiply-adds a cycle,
   against 1.4 for the former tree of lanes, whose pending sums spilled to memory). */
__attribute__((target("avx512f"))) static ALWAYS_INLINE void dots_t16_d(const float* const* q, float* const* scores,
                                                                      int64_t nq, const float* Kt, const int NG,
                                                                      const int64_t D) {
  for (int g0 = 0; g0 < NG; g0 += 2)
    for (int64_t x = 0; x < nq; x += 4) {
      const float* qx[4];
      for (int i = 0; i < 4; ++i) qx[i] = q[x + i < nq ? x + i : nq - 1]; /* short: the last again */
      __m512 total[8], first[8], second[8];
      lane_sums(qx, Kt + 16 * g0, 0, total, D);
      lane_sums(qx, Kt + 16 * g0, 8, second, D);
      for (int i = 0; i < 8; ++i) total[i] = _mm512_add_ps(total[i], second[i]);
      _Pragma("GCC unroll 1") for (int64_t c = 1; c < 8; ++c) {
        lane_sums(qx, Kt + 16 * g0, c, first, D);
        lane_sums(qx, Kt + 16 * g0, c + 8, second, D);
        for (int i = 0; i < 8; ++i) total[i] = _mm512_add_ps(total[i], _mm512_add_ps(first[i], second[i]));
      }
      for (int i = 0; i < 4 && x + i < nq; ++i) {
        _mm512_storeu_ps(scores[x + i] + 16 * g0, total[2 * i]);
        _mm512_storeu_ps(scores[x + i] + 16 * g0 + 16, total[2 * i + 1]);
      }
    }
}

/* dots_t16_d for a tile of `groups` groups of sixteen keys (its unused keys zero), with
   the common head sizes constant (the sums unrolled). */
__attribute__((target("avx512f"), noinline)) static void dots_t16(const float* const* q, float* const* scores,
                                                                 int64_t nq, const float* Kt, int64_t groups,
                                                                 int64_t D) {
  if (groups > 2) {
    switch (D) {
      case 64: dots_t16_d(q, scores, nq, Kt, 4, 64); break;
      case 128: dots_t16_d(q, scores, nq, Kt, 4, 128); break;
      default: dots_t16_d(q, scores, nq, Kt, 4, D); break;
    }
  } else {
    switch (D) {
      case 64: dots_t16_d(q, scores, nq, Kt, 2, 64); break;
      case 128: dots_t16_d(q, scores, nq, Kt, 2, 128); break;
      default: dots_t16_d(q, scores, nq, Kt, 2, D); break;
    }
  }
}

/* The same for AVX2 (dots_avx2's sums: eight lanes, each summed over the dimensions l,
   l + 8, ... in order, then sum4_ymm's tree: lanes (0 + 1) + (2 + 3), (4 + 5) + (6 + 7),
   then the two). Keys eight to a register, the tile transposed by transpose_tile_avx2. */
__attribute__((target("avx2,fma"))) static inline void transpose8(__m256* r) {
  __m256 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
    b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xEE);
    b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
    b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
  }
  /* b[4k + c] holds, in 128-bit lane L, elements 4L + c of rows 4k..4k+3 */
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
  }
}

/* transpose_tile with AVX2 (and F16C for a float16 cache): up to 64 keys, zero past m up
   to the 16 or 64 keys dots_t8 reads. */
__attribute__((target("avx2,fma,f16c"))) static void transpose_tile_avx2(const void* src, int kind, int64_t m,
                                                                        int64_t D, float* Kt) {
  __m256 r[8];
  const int64_t padded = m > 16 ? TILE : 16;
  for (int64_t k0 = 0; k0 < padded; k0 += 8)
    for (int64_t d0 = 0; d0 < D; d0 += 8) {
      for (int64_t i = 0; i < 8; ++i) {
        if (k0 + i >= m) {
          r[i] = _mm256_setzero_ps();
        } else if (kind == KV_F16) {
          r[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)src + (k0 + i) * D + d0)));
        } else if (kind == KV_I8) {
          const int8_t* row = (const int8_t*)src + (k0 + i) * I8_ROW(D);
          const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(row + d0))));
          r[i] = _mm256_mul_ps(q, _mm256_set1_ps(i8_scale(row, D)));
        } else {
          r[i] = _mm256_loadu_ps((const float*)src + (k0 + i) * D + d0);
        }
      }
      transpose8(r);
      for (int64_t i = 0; i < 8; ++i) _mm256_storeu_ps(Kt + (d0 + i) * TILE + k0, r[i]);
    }
}

/* scores[x][8 y + i] = q_x . key 8 y + i of the transposed tile, y < NG groups of eight:
   four queries by NG groups at a time, the lanes' sums in order 0..7, each odd lane added
   to the one before, each pair's sum to the pending pair, the quads at the end. */
__attribute__((target("avx2,fma"))) static ALWAYS_INLINE void dots_t8_d(const float* const* q, float* const* scores,
                                                                      int64_t nq, const float* Kt, const int NG,
                                                                      const int64_t D) {
  __m256 slots[3][8]; /* pending: lane, pair, quad; [query * NG + group] */
  for (int64_t x = 0; x < nq; x += 4) {
    const float* qx[4];
    for (int i = 0; i < 4; ++i) qx[i] = q[x + i < nq ? x + i : nq - 1];
    _Pragma("GCC unroll 1") for (int l = 0; l < 8; ++l) {
      __m256 acc[8];
      for (int i = 0; i < 4 * NG; ++i) acc[i] = _mm256_setzero_ps();
      _Pragma("GCC unroll 16") for (int64_t j = 0; j < D / 8; ++j) {
        const int64_t d = 8 * j + l;
        __m256 k[2];
        for (int g = 0; g < NG; ++g) k[g] = _mm256_loadu_ps(Kt + d * TILE + 8 * g);
        for (int i = 0; i < 4; ++i) {
          const __m256 b = _mm256_set1_ps(qx[i][d]);
          for (int g = 0; g < NG; ++g) acc[i * NG + g] = _mm256_fmadd_ps(b, k[g], acc[i * NG + g]);
        }
      }
      int level = 0;
      for (; level < 3 && (l >> level) & 1; ++level)
        for (int i = 0; i < 4 * NG; ++i) acc[i] = _mm256_add_ps(acc[i], slots[level][i]);
      if (level < 3) {
        for (int i = 0; i < 4 * NG; ++i) slots[level][i] = acc[i];
        continue;
      }
      for (int i = 0; i < 4 && x + i < nq; ++i)
        for (int g = 0; g < NG; ++g) _mm256_storeu_ps(scores[x + i] + 8 * g, acc[i * NG + g]);
    }
  }
}

/* dots_t8_d over `groups` groups of eight keys, two at a time (the tile's unused keys
   zero), with the common head sizes constant. */
__attribute__((target("avx2,fma"), noinline)) static void dots_t8(const float* const* q, float* const* scores,
                                                                 int64_t nq, const float* Kt, int64_t groups,
                                                                 int64_t D) {
  for (int64_t y = 0; y < groups; y += 2) {
    float* at[MAX_VECTORS];
    for (int64_t x = 0; x < nq; ++x) at[x] = scores[x] + 8 * y;
    switch (D) {
      case 64: dots_t8_d(q, at, nq, Kt + 8 * y, 2, 64); break;
      case 128: dots_t8_d(q, at, nq, Kt + 8 * y, 2, 128); break;
      default: dots_t8_d(q, at, nq, Kt + 8 * y, 2, D); break;
    }
  }
}

/* ---- an int16 cache's attention on AVX-512 VNNI ------------------------------------------

   The whole numbers of the section "an int16 cache" on VPDPWSSD, 32 int16 products an
   instruction where a float32 multiply-add makes 16 (both two a cycle on Zen 5). A tile's
   keys are transposed to sixteen keys a register (pairs of dimensions in each lane) and
   every query vector's pairs broadcast against them, so a prefill block needs no lane
   reductions; a tile's values go by pairs of positions, each query vector's weights (as
   whole numbers) broadcast by pairs. The rows are whole numbers already: reading a tile
   is a transposition, no arithmetic. */

#define I16_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl")))

/* Where an int16 cache's attention runs on VPDPWSSD (vnni_rows, set at registration): 1
   AVX-512 VNNI, 2 AVX-VNNI (the section after this one), 0 plain C. */
static int g_vnni;

/* Ask for the sixteen rows a tile (TILE rows) after the sixteen at src: a decode step reads
   the cache once, at memory's pace, and the rows' 2 * D + 2 bytes start where the hardware's
   stream prediction does not keep up with them (decode attention 25 GB/s without this). */
static inline void i16_ahead(const int16_t* src, const int64_t D) {
  const char* ahead = (const char*)(src + TILE * I16_ROW(D));
  for (int64_t b = 0; b < 16 * 2 * I16_ROW(D); b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
}

/* Keys k0..k0 + 15 of an int16 cache's tile (rows of I16_ROW(D) at src, the first `m`
   there, the rest zero) as i16_keys leaves a float16 tile's: kt[p * TILE + k0 + i] = key
   i's pair p (the rows' own order: dimensions 2p and 2p + 1), scale[k0 + i] its scale.
   Only a transposition: the rows are whole numbers already. */
I16_TARGET static void i16_row_keys(const int16_t* src, int64_t m, const int64_t D, int32_t* kt, float* scale) {
  i16_ahead(src, D);
  for (int64_t i = 0; i < 16; ++i) scale[i] = i < m ? i16_row_scale(src + i * I16_ROW(D), D) : 0.0f;
  for (int64_t h = 0; h < D / 32; ++h) {
    __m512 rows[16];
    for (int64_t i = 0; i < 16; ++i)
      rows[i] = i < m ? _mm512_castsi512_ps(_mm512_loadu_si512(src + i * I16_ROW(D) + 32 * h)) : _mm512_setzero_ps();
    transpose16(rows, rows); /* rows[c]: pair 16h + c of the sixteen keys */
    for (int c = 0; c < 16; ++c) _mm512_storeu_ps((float*)kt + (16 * h + c) * TILE, rows[c]);
  }
}

/* Values v0..v0 + 15 of an int16 cache's tile by pairs of positions, as i16_values leaves
   a float16 tile's: vt[(j * (D / 16) + c) * 16 + l] = value 2j's q[16c + l] in the low
   half, value 2j + 1's in the high half; scale[v0 + i] value i's scale. */
I16_TARGET static void i16_row_values(const int16_t* src, int64_t m, const int64_t D, int32_t* vt, float* scale) {
  i16_ahead(src, D);
  int16_t order[2][32]; /* int16 lane 2l: a's dimension l (or 16 + l); lane 2l + 1: b's (b from 32) */
  for (int l = 0; l < 16; ++l) {
    order[0][2 * l] = (int16_t)l;
    order[0][2 * l + 1] = (int16_t)(32 + l);
    order[1][2 * l] = (int16_t)(16 + l);
    order[1][2 * l + 1] = (int16_t)(48 + l);
  }
  const __m512i first = _mm512_loadu_si512(order[0]), second = _mm512_loadu_si512(order[1]);
  for (int64_t i = 0; i < 16; ++i) scale[i] = i < m ? i16_row_scale(src + i * I16_ROW(D), D) : 0.0f;
  for (int64_t i = 0; i < 16; i += 2)
    for (int64_t h = 0; h < D / 32; ++h) {
      const __m512i a = i < m ? _mm512_loadu_si512(src + i * I16_ROW(D) + 32 * h) : _mm512_setzero_si512();
      const __m512i b = i + 1 < m ? _mm512_loadu_si512(src + (i + 1) * I16_ROW(D) + 32 * h) : _mm512_setzero_si512();
      int32_t* at = vt + ((i / 2) * (D / 16) + 2 * h) * 16;
      _mm512_storeu_si512(at, _mm512_permutex2var_epi16(a, first, b));
      _mm512_storeu_si512(at + 16, _mm512_permutex2var_epi16(a, second, b));
    }
}

/* One query vector's weights over a tile as whole numbers: w_t = p[t] * sv[t] for t < m (0
   beyond, up to `len`, a multiple of 32), scaled so the largest is M and rounded to nearest
   even; wq[j] = the pair (w_2j, w_2j+1) (low half first). Returns the weights' scale. */
I16_TARGET static float i16_weights(const float* p, const float* sv, int64_t m, int64_t len, float M, int32_t* wq) {
  __m512 w[TILE / 16];
  __m512 top = _mm512_setzero_ps();
  for (int64_t c = 0; c < len / 16; ++c) {
    const int64_t left = m - 16 * c;
    const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
    w[c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(keep, p + 16 * c), _mm512_maskz_loadu_ps(keep, sv + 16 * c));
    top = _mm512_max_ps(_mm512_abs_ps(w[c]), top);
  }
  const float most = _mm512_reduce_max_ps(top);
  const __m512 inv = _mm512_set1_ps(i16_factor(M, most));
  for (int64_t c = 0; c < len / 16; ++c)
    _mm256_storeu_si256((__m256i*)(wq + 8 * c), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(w[c], inv))));
  return most / M;
}

/* acc + VPDPWSSD(a, b), written out: GCC's intrinsic copies the sum to another register and
   back around each instruction in these loops (three instructions for one). */
I16_TARGET static inline __m512i i16_dp(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

/* scores[x][16 g + i] = q_x . key 16 g + i of the whole-number tile kt (NG groups of
   sixteen keys), for the N query vectors qq[0..N-1] (scales sq): N x NG sums in
   registers, one VPDPWSSD a query's pair and a group. */
I16_TARGET static ALWAYS_INLINE void i16_dots_n(const int32_t* const* qq, const float* sq, float* const* scores,
                                                const int32_t* kt, const float* sk, const int N, const int NG,
                                                const int64_t D) {
  __m512i acc[6][4];
  for (int i = 0; i < N; ++i)
    for (int g = 0; g < NG; ++g) acc[i][g] = _mm512_setzero_si512();
  _Pragma("GCC unroll 4") for (int64_t p = 0; p < D / 2; ++p) {
    __m512i k[4];
    for (int g = 0; g < NG; ++g) k[g] = _mm512_loadu_si512(kt + p * TILE + 16 * g);
    for (int i = 0; i < N; ++i) {
      const __m512i b = _mm512_set1_epi32(qq[i][p]);
      for (int g = 0; g < NG; ++g) acc[i][g] = i16_dp(acc[i][g], k[g], b);
    }
  }
  for (int i = 0; i < N; ++i) {
    const __m512 s = _mm512_set1_ps(sq[i]);
    for (int g = 0; g < NG; ++g)
      _mm512_storeu_ps(scores[i] + 16 * g,
                       _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][g]), s), _mm512_loadu_ps(sk + 16 * g)));
  }
}

/* i16_dots_n for nq query vectors, six at a time, over `groups` (2 or 4) groups of keys,
   with the common head sizes constant. */
I16_TARGET __attribute__((noinline)) static void i16_dots(const int32_t* const* qq, const float* sq,
                                                          float* const* scores, int64_t nq, const int32_t* kt,
                                                          const float* sk, int64_t groups, int64_t D) {
  for (int64_t x = 0; x < nq; x += 6) {
    const int64_t n = nq - x < 6 ? nq - x : 6;
#define I16_CASE(N, NG)                                                                   \
  case N:                                                                                 \
    if (D == 64)                                                                          \
      i16_dots_n(qq + x, sq + x, scores + x, kt, sk, N, NG, 64);                          \
    else if (D == 96)                                                                     \
      i16_dots_n(qq + x, sq + x, scores + x, kt, sk, N, NG, 96);                          \
    else if (D == 128)                                                                    \
      i16_dots_n(qq + x, sq + x, scores + x, kt, sk, N, NG, 128);                         \
    else                                                                                  \
      i16_dots_n(qq + x, sq + x, scores + x, kt, sk, N, NG, D);                           \
    break;
    if (groups > 2) {
      switch (n) { I16_CASE(1, 4) I16_CASE(2, 4) I16_CASE(3, 4) I16_CASE(4, 4) I16_CASE(5, 4) I16_CASE(6, 4) }
    } else {
      switch (n) { I16_CASE(1, 2) I16_CASE(2, 2) I16_CASE(3, 2) I16_CASE(4, 2) I16_CASE(5, 2) I16_CASE(6, 2) }
    }
#undef I16_CASE
  }
}

/* acc[x] += ((float)(sum over pairs j < pairs of wq[x][j] . vt's pair j) * sw[x]), for N
   query vectors of a head of D = 16 Z: N x Z sums in registers, the tile's value pairs
   loaded once for the N. */
I16_TARGET static ALWAYS_INLINE void i16_weigh_n(const int32_t* const* wq, const float* sw, const int32_t* vt,
                                                 int64_t pairs, float* const* acc, const int N, const int Z) {
  __m512i sum[24];
  for (int i = 0; i < N * Z; ++i) sum[i] = _mm512_setzero_si512();
  _Pragma("GCC unroll 2") for (int64_t j = 0; j < pairs; ++j) {
    __m512i v[16];
    for (int c = 0; c < Z; ++c) v[c] = _mm512_loadu_si512(vt + (j * Z + c) * 16);
    for (int i = 0; i < N; ++i) {
      const __m512i b = _mm512_set1_epi32(wq[i][j]);
      for (int c = 0; c < Z; ++c) sum[i * Z + c] = i16_dp(sum[i * Z + c], v[c], b);
    }
  }
  for (int i = 0; i < N; ++i) {
    const __m512 s = _mm512_set1_ps(sw[i]);
    for (int c = 0; c < Z; ++c)
      _mm512_storeu_ps(acc[i] + 16 * c, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i * Z + c]), s,
                                                        _mm512_loadu_ps(acc[i] + 16 * c)));
  }
}

/* i16_weigh_n for nv query vectors, as many at a time as 24 registers of sums hold (heads
   of 32, 64, 96 and 128; one at a time for the rest). */
I16_TARGET __attribute__((noinline)) static void i16_weigh(const int32_t* const* wq, const float* sw,
                                                           const int32_t* vt, int64_t pairs, float* const* acc,
                                                           int64_t nv, int64_t D) {
  const int Z = (int)(D / 16), wide = 24 / Z < 6 ? 24 / Z : 6;
  for (int64_t x = 0; x < nv; x += wide) {
    const int64_t n = nv - x < wide ? nv - x : wide;
#define I16_W(N, Z) \
  case N: i16_weigh_n(wq + x, sw + x, vt, pairs, acc + x, N, Z); break;
    if (Z == 2) {
      switch (n) { I16_W(1, 2) I16_W(2, 2) I16_W(3, 2) I16_W(4, 2) I16_W(5, 2) I16_W(6, 2) }
    } else if (Z == 4) {
      switch (n) { I16_W(1, 4) I16_W(2, 4) I16_W(3, 4) I16_W(4, 4) I16_W(5, 4) I16_W(6, 4) }
    } else if (Z == 6) {
      switch (n) { I16_W(1, 6) I16_W(2, 6) I16_W(3, 6) I16_W(4, 6) }
    } else if (Z == 8) {
      switch (n) { I16_W(1, 8) I16_W(2, 8) I16_W(3, 8) }
    } else {
      for (int64_t e = 0; e < n; ++e) i16_weigh_n(wq + x + e, sw + x + e, vt, pairs, acc + x + e, 1, Z);
    }
#undef I16_W
  }
}

/* ---- an int16 cache's attention on AVX-VNNI (256-bit) --------------------------------------

   The same whole numbers on CPUs with AVX-VNNI but no AVX-512 (Intel's client cores since
   Alder Lake): VPDPWSSD on 256-bit registers, 16 int16 products an instruction where an
   AVX2 multiply-add makes 8. The tiles keep the AVX-512 section's layout (kt: sixteen keys
   a pair of dimensions; vt: pairs of positions), read eight lanes at a time; the integer
   sums are exact and the float steps come in the same order, so the bits are those of the
   plain C loops and of the AVX-512 code (the tests compare all three). */

/* An int16 cache's step `f` on the 256-bit code (i16y_f) or the 512-bit one (i16_f), as
   g_vnni says: direct calls (a pointer chosen between the two cost decode 15-30%). */
#define I16_CALL(f, ...) (g_vnni == 2 ? i16y_##f(__VA_ARGS__) : i16_##f(__VA_ARGS__))

/* AVX-VNNI's target and the assembler's {vex}: GCC 11 and clang 12 onwards (Apple's 13:
   its 12 predates the target), with binutils 2.36 or later under GCC; setup.py builds again
   with ENGINE_NO_AVX_VNNI where that fails. Without the section such CPUs run plain C. */
#if !defined(ENGINE_NO_AVX_VNNI) &&                                                         \
    ((defined(__clang__) && __clang_major__ >= (defined(__apple_build_version__) ? 13 : 12)) || \
     (!defined(__clang__) && __GNUC__ >= 11))
#define HAVE_AVX_VNNI 1
#include <cpuid.h>
#define I16Y_TARGET __attribute__((target("avx2,fma,avxvnni")))

/* 1 where the CPU has AVX-VNNI (CPUID leaf 7, sub-leaf 1: EAX bit 4). */
static int avx_vnni_cpu(void) {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1u);
}

/* acc + VPDPWSSD(a, b), VEX-encoded (no AVX-512 needed). */
I16Y_TARGET static inline __m256i i16y_dp(__m256i acc, __m256i a, __m256i b) {
  __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
  return acc;
}

/* i16_row_keys on AVX2: the same kt and scales, eight keys at a time. */
I16Y_TARGET static void i16y_row_keys(const int16_t* src, int64_t m, const int64_t D, int32_t* kt, float* scale) {
  i16_ahead(src, D);
  for (int64_t i = 0; i < 16; ++i) scale[i] = i < m ? i16_row_scale(src + i * I16_ROW(D), D) : 0.0f;
  for (int64_t i0 = 0; i0 < 16; i0 += 8)
    for (int64_t h = 0; h < D / 16; ++h) {
      __m256 rows[8];
      for (int64_t i = 0; i < 8; ++i)
        rows[i] = i0 + i < m ? _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i*)(src + (i0 + i) * I16_ROW(D) + 16 * h)))
                             : _mm256_setzero_ps();
      transpose8(rows); /* rows[c]: pair 8h + c of the eight keys */
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps((float*)kt + (8 * h + c) * TILE + i0, rows[c]);
    }
}

/* i16_row_values on AVX2: the same vt (value 2j's q[16c + l] and 2j + 1's as the pair at
   (j * (D / 16) + c) * 16 + l) and scales. */
I16Y_TARGET static void i16y_row_values(const int16_t* src, int64_t m, const int64_t D, int32_t* vt, float* scale) {
  i16_ahead(src, D);
  for (int64_t i = 0; i < 16; ++i) scale[i] = i < m ? i16_row_scale(src + i * I16_ROW(D), D) : 0.0f;
  for (int64_t i = 0; i < 16; i += 2)
    for (int64_t c = 0; c < D / 16; ++c) {
      const __m256i a = i < m ? _mm256_loadu_si256((const __m256i*)(src + i * I16_ROW(D) + 16 * c)) : _mm256_setzero_si256();
      const __m256i b =
          i + 1 < m ? _mm256_loadu_si256((const __m256i*)(src + (i + 1) * I16_ROW(D) + 16 * c)) : _mm256_setzero_si256();
      /* within each 128-bit half: lo pairs l = 0..3 (and 8..11), hi 4..7 (and 12..15) */
      const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
      int32_t* at = vt + ((i / 2) * (D / 16) + c) * 16;
      _mm256_storeu_si256((__m256i*)at, _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256((__m256i*)(at + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
}

/* i16_weights on AVX2: the same whole-number weights and scale. */
I16Y_TARGET static float i16y_weights(const float* p, const float* sv, int64_t m, int64_t len, float M, int32_t* wq) {
  __m256 w[TILE / 8];
  __m256 top = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i low_halves = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8,
                                              9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  for (int64_t c = 0; c < len / 8; ++c) {
    const int64_t left = m - 8 * c;
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left > 8 ? 8 : left < 0 ? 0 : left)), lane);
    w[c] = _mm256_mul_ps(_mm256_maskload_ps(p + 8 * c, keep), _mm256_maskload_ps(sv + 8 * c, keep));
    top = _mm256_max_ps(_mm256_andnot_ps(sign, w[c]), top);
  }
  __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
  t4 = _mm_max_ss(t4, _mm_shuffle_ps(t4, t4, 1));
  const float most = _mm_cvtss_f32(t4);
  const __m256 inv = _mm256_set1_ps(i16_factor(M, most));
  for (int64_t c = 0; c < len / 8; ++c) {
    /* each int32's low half, as VPMOVDW keeps it (a NaN weight, from a malformed row, gives
       0 on both paths; a finite one is within M anyway) */
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(w[c], inv));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(q, low_halves), 0x08);
    _mm_storeu_si128((__m128i*)(wq + 4 * c), _mm256_castsi256_si128(packed));
  }
  return most / M;
}

/* i16_dots_n on AVX2 for one group of sixteen keys (two registers of eight): N x 2 sums. */
I16Y_TARGET static ALWAYS_INLINE void i16y_dots_n(const int32_t* const* qq, const float* sq, float* const* scores,
                                                  const int32_t* kt, const float* sk, const int N, const int64_t D) {
  __m256i acc[4][2];
  for (int i = 0; i < N; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  _Pragma("GCC unroll 4") for (int64_t p = 0; p < D / 2; ++p) {
    const __m256i k0 = _mm256_loadu_si256((const __m256i*)(kt + p * TILE)),
                  k1 = _mm256_loadu_si256((const __m256i*)(kt + p * TILE + 8));
    for (int i = 0; i < N; ++i) {
      const __m256i b = _mm256_set1_epi32(qq[i][p]);
      acc[i][0] = i16y_dp(acc[i][0], k0, b);
      acc[i][1] = i16y_dp(acc[i][1], k1, b);
    }
  }
  for (int i = 0; i < N; ++i) {
    const __m256 s = _mm256_set1_ps(sq[i]);
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(scores[i] + 8 * h, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][h]), s),
                                                        _mm256_loadu_ps(sk + 8 * h)));
  }
}

/* i16_dots on AVX2: nq query vectors, four at a time (eight sums, two keys' registers and a
   broadcast: no spills in sixteen registers), a group of sixteen keys at a time. */
I16Y_TARGET __attribute__((noinline)) static void i16y_dots(const int32_t* const* qq, const float* sq,
                                                            float* const* scores, int64_t nq, const int32_t* kt,
                                                            const float* sk, int64_t groups, int64_t D) {
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t x = 0; x < nq; x += 4) {
      const int64_t n = nq - x < 4 ? nq - x : 4;
      float* at[4];
      for (int64_t i = 0; i < n; ++i) at[i] = scores[x + i] + 16 * g;
#define I16Y_CASE(N)                                                                    \
  case N:                                                                               \
    if (D == 64)                                                                        \
      i16y_dots_n(qq + x, sq + x, at, kt + 16 * g, sk + 16 * g, N, 64);                 \
    else if (D == 128)                                                                  \
      i16y_dots_n(qq + x, sq + x, at, kt + 16 * g, sk + 16 * g, N, 128);                \
    else                                                                                \
      i16y_dots_n(qq + x, sq + x, at, kt + 16 * g, sk + 16 * g, N, D);                  \
    break;
      switch (n) { I16Y_CASE(1) I16Y_CASE(2) I16Y_CASE(3) I16Y_CASE(4) }
#undef I16Y_CASE
    }
}

/* i16_weigh_n on AVX2 for dimensions 32h..32h + 31 of N query vectors: N x 4 sums. */
I16Y_TARGET static ALWAYS_INLINE void i16y_weigh_n(const int32_t* const* wq, const float* sw, const int32_t* vt,
                                                   int64_t pairs, float* const* acc, const int N, const int64_t D,
                                                   int64_t h) {
  __m256i sum[2][4];
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < 4; ++c) sum[i][c] = _mm256_setzero_si256();
  _Pragma("GCC unroll 1") for (int64_t j = 0; j < pairs; ++j) { /* unrolled, GCC 12 spills */
    const int32_t* at = vt + (j * (D / 16) + 2 * h) * 16;
    __m256i b[2];
    for (int i = 0; i < N; ++i) b[i] = _mm256_set1_epi32(wq[i][j]);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(at + 8 * c));
      for (int i = 0; i < N; ++i) sum[i][c] = i16y_dp(sum[i][c], v, b[i]);
    }
  }
  for (int i = 0; i < N; ++i) {
    const __m256 s = _mm256_set1_ps(sw[i]);
    for (int c = 0; c < 4; ++c) {
      float* a = acc[i] + 32 * h + 8 * c;
      _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i][c]), s, _mm256_loadu_ps(a)));
    }
  }
}

/* i16_weigh on AVX2: nv query vectors, two at a time (eight sums, two broadcasts and a
   value register: no spills), 32 dimensions at a time. */
I16Y_TARGET __attribute__((noinline)) static void i16y_weigh(const int32_t* const* wq, const float* sw,
                                                             const int32_t* vt, int64_t pairs, float* const* acc,
                                                             int64_t nv, int64_t D) {
  for (int64_t x = 0; x < nv; x += 2) {
    const int64_t n = nv - x < 2 ? nv - x : 2;
    for (int64_t h = 0; h < D / 32; ++h) {
      if (n == 2)
        i16y_weigh_n(wq + x, sw + x, vt, pairs, acc + x, 2, D, h);
      else
        i16y_weigh_n(wq + x, sw + x, vt, pairs, acc + x, 1, D, h);
    }
  }
}
#else
/* Never called (g_vnni is never 2 without the section): the names for the dispatch. */
#define i16y_row_keys i16_row_keys
#define i16y_row_values i16_row_values
#define i16y_weights i16_weights
#define i16y_dots i16_dots
#define i16y_weigh i16_weigh
#endif

/* ---- AMX: an int8 cache's scores in bfloat16 tiles --------------------------------------

   Where the CPU has AMX-BF16 (and Linux lets the process use its tiles), the scores over an
   int8 cache run on the tile unit: S^T = q Q^T, sixteen keys' integers (the A tile: each
   q is exact in bfloat16) by sixteen query vectors (B, transposed into pairs of
   dimensions), then each key's row times its scale. A query vector x is split into two
   bfloat16 parts, hi (x rounded to nearest) + lo (the rest, rounded: within 2^-18 of x),
   so the two tile products hi.q + lo.q, summed in float32 by the tile unit, have every
   product exact. The softmax and the weighted sums of values stay the AVX-512 code's.

   An element of a tile product depends only on its A row and B column, and the products
   and the key groups always come in the same order, so a row's scores are the same bits
   whatever rows share its tiles: a decode step, a prefill chunk and a check all run this
   code (the choice depends on the CPU, the cache's element and the head size, never on the
   rows). For a float16 or float32 cache the keys would first have to be split into two
   bfloat16 each: that costs a decode step what the AVX-512 dot products do, so those
   caches keep them (engine/README.md has the figures). */
/* AMX intrinsics: GCC 11 and clang 12 onwards (an older compiler builds the rest) */
#if defined(__linux__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                           (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define HAVE_AMX 1
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))
#define TILE_BYTES 1024 /* 16 rows of 64 bytes: every tile this code loads */
#define AMX_MAX_HEAD 128
/* per thread: Q^T (16-vector tiles x head/32 x hi, lo), two groups of sixteen keys' rows
   (each hi, then lo for a float16 cache), two score tiles as floats and a chunk's scales */
#define AMX_Q_BYTES ((MAX_VECTORS / 16) * (AMX_MAX_HEAD / 32) * 2 * TILE_BYTES)
#define AMX_GROUP_HALVES (2 * 16 * AMX_MAX_HEAD) /* one group of keys: hi and lo rows */
#define AMX_K_BYTES (2 * AMX_GROUP_HALVES * 2)
#define AMX_SCRATCH (AMX_Q_BYTES + AMX_K_BYTES + 2 * 16 * 16 * 4 + CHUNK * 4)

/* 1: an int8 or float16 cache's scores run on AMX tiles (set at registration). */
static int g_amx;

typedef struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} TileConfig;

/* Whether this CPU and kernel give the process AMX-BF16 tiles (asks Linux for them). */
static int amx_available(void) {
  if (!__builtin_cpu_supports("amx-bf16") || !__builtin_cpu_supports("avx512bf16") ||
      !__builtin_cpu_supports("avx512bw"))
    return 0;
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

static pthread_key_t g_amx_key;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static void amx_make_key(void) { (void)pthread_key_create(&g_amx_key, free); }

/* This thread's AMX scratch (AMX_SCRATCH bytes, 64-aligned; freed when the thread ends),
   or NULL when there is no memory. */
static unsigned char* amx_scratch(void) {
  (void)pthread_once(&g_amx_once, amx_make_key);
  unsigned char* p = (unsigned char*)pthread_getspecific(g_amx_key);
  if (p == NULL) {
    if (posix_memalign((void**)&p, 64, AMX_SCRATCH) != 0) return NULL;
    if (pthread_setspecific(g_amx_key, p) != 0) {
      free(p);
      return NULL;
    }
  }
  return p;
}

/* Every tile 16 rows of 64 bytes; a constant (GCC 12's _tile_loadconfig tells the compiler
   it reads 8 bytes, so stores into a local configuration could be dropped). Loaded at each
   use: other code on this thread (ONNX Runtime's own AMX kernels) may have loaded another. */
static const TileConfig AMX_CONFIG = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

AMX_TARGET static void amx_begin(void) { _tile_loadconfig(&AMX_CONFIG); }

AMX_TARGET static void amx_end(void) { _tile_release(); }

/* x's value rounded to the nearest bfloat16 (ties to even), as a float. */
AMX_TARGET static inline __m512 bf16_near(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32((int)0xffff0000u)));
}

/* x0 (elements 0-15) and x1 (16-31) as 32 bfloat16 hi + lo: hi rounded to nearest, lo the
   rest rounded to nearest. */
AMX_TARGET static inline void split32(__m512 x0, __m512 x1, __m512i* hi, __m512i* lo) {
  const __m512 h0 = bf16_near(x0), h1 = bf16_near(x1);
  *hi = (__m512i)_mm512_cvtne2ps_pbh(h1, h0);
  *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0));
}

/* The block's segment of one batch row, as the AMX code reads it. */
typedef struct AmxPart {
  const Step* s;
  int64_t ra, rb, g, t0, reach; /* rows ra..rb-1, KV head g, positions t0.. (reach of them) */
  const char* keys;             /* the batch row's KV head's row t0 (KV_I8 or KV_F16 rows) */
  int kind;
} AmxPart;

/* Query vector v of the part (v < (rb - ra) * group). */
#define AMX_Q(a, v) ((a)->s->q + (((a)->ra + (v) / (a)->s->group) * (a)->s->heads + (a)->g * (a)->s->group + (v) % (a)->s->group) * D)

/* Query vector v's dimensions 32 h.. as bfloat16 hi and lo (split32); zero for v >= nq. */
AMX_TARGET static inline void amx_query_parts(const AmxPart* a, int64_t v, int64_t nq, int64_t h, __m512* hi,
                                              __m512* lo, const int64_t D) {
  __m512i x = _mm512_setzero_si512(), y = x;
  if (v < nq) {
    const float* q = AMX_Q(a, v) + 32 * h;
    split32(_mm512_loadu_ps(q), _mm512_loadu_ps(q + 16), &x, &y);
  }
  *hi = _mm512_castsi512_ps(x);
  *lo = _mm512_castsi512_ps(y);
}

/* Q^T as B tiles: tile (qt, h, part) holds query vectors 16 qt.. and dimensions 32 h..,
   row p the pairs (2p, 2p + 1) of the sixteen vectors (hi, then lo). */
AMX_TARGET static void amx_pack_queries(const AmxPart* a, unsigned char* qb, int64_t nq, const int64_t D) {
  const int64_t H = D / 32;
  for (int64_t qt = 0; qt * 16 < nq; ++qt)
    for (int64_t h = 0; h < H; ++h) {
      __m512 hi[16], lo[16];
      for (int64_t n = 0; n < 16; ++n) amx_query_parts(a, qt * 16 + n, nq, h, &hi[n], &lo[n], D);
      transpose16(hi, hi);
      transpose16(lo, lo);
      unsigned char* t = qb + (qt * H + h) * 2 * TILE_BYTES;
      for (int p = 0; p < 16; ++p) {
        _mm512_store_ps((float*)(t + p * 64), hi[p]);
        _mm512_store_ps((float*)(t + TILE_BYTES + p * 64), lo[p]);
      }
    }
}

/* Sixteen keys' scores for the query vectors of tile qt (C holds key i's in row i, to be
   multiplied by scale[i]) into their rows of `scores` at kt: a transposition, or for a few
   vectors their columns. */
AMX_TARGET static inline void amx_scatter(const float* c, const float* scale, float* scores, int64_t qt, int64_t kt,
                                          int64_t nq) {
  const int64_t valid = nq - 16 * qt < 16 ? nq - 16 * qt : 16;
  const __m512 keys_scale = _mm512_loadu_ps(scale);
  if (valid <= 4) {
    const __m512i rows = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0);
    for (int64_t n = 0; n < valid; ++n)
      _mm512_storeu_ps(scores + (qt * 16 + n) * CHUNK + kt,
                       _mm512_mul_ps(_mm512_i32gather_ps(rows, c + n, 4), keys_scale));
    return;
  }
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(c + 16 * i);
  transpose16(r, r); /* r[n]: vector 16 qt + n's sums for the sixteen keys */
  for (int64_t n = 0; n < valid; ++n)
    _mm512_storeu_ps(scores + (qt * 16 + n) * CHUNK + kt, _mm512_mul_ps(r[n], keys_scale));
}

/* Keys 16 k.. of a float16 part as bfloat16 rows into kq: hi (16 rows of D), then lo (16
   rows): hi the key cut to a bfloat16, lo the rest. A float16 has three significant bits
   more than a bfloat16, so both are exact and hi + lo is the key. Zero past reach. */
AMX_TARGET static inline void amx_stage_f16(const AmxPart* a, int64_t k, uint16_t* kq, const int64_t D) {
  const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t key = 16 * k + i;
    const uint16_t* row = (const uint16_t*)a->keys + key * D;
    if (key + 32 < a->reach) _mm_prefetch((const char*)(row + 32 * D), _MM_HINT_T0);
    for (int64_t h = 0; h < D / 32; ++h) {
      __m512i hi = _mm512_setzero_si512(), lo = hi;
      if (key < a->reach) {
        const __m512 x0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + 32 * h)));
        const __m512 x1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + 32 * h + 16)));
        const __m512 h0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), top));
        const __m512 h1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), top));
        hi = (__m512i)_mm512_cvtne2ps_pbh(h1, h0);
        lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0));
      }
      _mm512_store_si512((__m512i*)(kq + i * D + 32 * h), hi);
      _mm512_store_si512((__m512i*)(kq + 16 * D + i * D + 32 * h), lo);
    }
  }
}

/* Keys 16 k.. of the part: their integers as bfloat16 rows into kq (zero past reach), their
   scales into scale. A key four groups ahead is fetched meanwhile. */
AMX_TARGET static inline void amx_stage(const AmxPart* a, int64_t k, uint16_t* kq, float* scale, const int64_t D) {
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t key = 16 * k + i;
    const int8_t* row = (const int8_t*)a->keys + key * I8_ROW(D);
    if (key + 64 < a->reach) _mm_prefetch((const char*)(row + 64 * I8_ROW(D)), _MM_HINT_T0);
    scale[i] = key < a->reach ? i8_scale(row, D) : 0.0f;
    for (int64_t h = 0; h < D / 32; ++h) {
      __m512i x = _mm512_setzero_si512();
      if (key < a->reach) {
        const __m128i* q = (const __m128i*)(row + 32 * h);
        x = (__m512i)_mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))),
                                         _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
      }
      _mm512_store_si512((__m512i*)(kq + i * D + 32 * h), x);
    }
  }
}

/* The scores of the part's query vectors over positions 0..reach-1 of the chunk into
   `scores` (row v of the part at scores + v * CHUNK), sixteen keys a tile. Software
   pipelined: the next sixteen keys are staged while the tile unit works on these, and two
   score tiles take turns, one moved into the rows while the other is computed. (A float16
   cache: amx_scores_f16.) */
AMX_TARGET static void amx_scores(const AmxPart* a, unsigned char* stage, int64_t nq, float* scores,
                                  const int64_t D) {
  const int64_t H = D / 32, groups = (a->reach + 15) / 16;
  unsigned char* qb = stage;
  uint16_t* kbuf = (uint16_t*)(stage + AMX_Q_BYTES); /* two groups of [16][D] (hi, lo) */
  float* c = (float*)(stage + AMX_Q_BYTES + AMX_K_BYTES); /* two tiles of floats */
  float* scales = c + 2 * 256;                             /* the chunk's keys' */
  amx_pack_queries(a, qb, nq, D);
  amx_stage(a, 0, kbuf, scales, D);
  int flip = 0;                          /* the score tile next computed: 0 or 7 */
  int64_t pending_q = -1, pending_k = 0; /* the tile in c + 256 * !flip not yet moved */
  /* score tile C for vector tile qt and the group's keys: q.hi then q.lo for each 32
     dimensions in turn (with a head of 64 the keys' two tiles stay loaded, 1 and 2) */
#define AMX_TILE(C)                                                     \
  do {                                                                  \
    _tile_zero(C);                                                      \
    for (int64_t h = 0; h < H; ++h) {                                   \
      const unsigned char* t_ = qb + (qt * H + h) * 2 * TILE_BYTES;     \
      _tile_loadd(5, t_, 64);                                           \
      _tile_loadd(6, t_ + TILE_BYTES, 64);                              \
      if (H == 2 && h == 1) {                                           \
        _tile_dpbf16ps(C, 2, 5);                                        \
        _tile_dpbf16ps(C, 2, 6);                                        \
      } else {                                                          \
        if (H != 2) _tile_loadd(1, kq + 32 * h, 2 * D);                 \
        _tile_dpbf16ps(C, 1, 5);                                        \
        _tile_dpbf16ps(C, 1, 6);                                        \
      }                                                                 \
    }                                                                   \
    _tile_stored(C, c + 256 * ((C) != 0), 64);                          \
  } while (0)
  for (int64_t k = 0; k < groups; ++k) {
    const uint16_t* kq = kbuf + (k & 1) * 2 * 16 * D;
    if (k + 1 < groups) amx_stage(a, k + 1, kbuf + ((k + 1) & 1) * 2 * 16 * D, scales + 16 * (k + 1), D);
    if (H == 2) {
      _tile_loadd(1, kq, 2 * D);
      _tile_loadd(2, kq + 32, 2 * D);
    }
    for (int64_t qt = 0; qt * 16 < nq; ++qt) {
      if (flip)
        AMX_TILE(7);
      else
        AMX_TILE(0);
      if (pending_q >= 0) amx_scatter(c + 256 * !flip, scales + 16 * pending_k, scores, pending_q, 16 * pending_k, nq);
      pending_q = qt;
      pending_k = k;
      flip = !flip;
    }
  }
  amx_scatter(c + 256 * !flip, scales + 16 * pending_k, scores, pending_q, 16 * pending_k, nq);
#undef AMX_TILE
}

/* Q^T for a float16 cache: tile (qt, h) holds query vectors 8 qt.. and dimensions 32 h..,
   its columns 0-7 the vectors' hi, 8-15 their lo (row p the pairs 2p, 2p + 1). */
AMX_TARGET static void amx_pack_queries_f16(const AmxPart* a, unsigned char* qb, int64_t nq, const int64_t D) {
  const int64_t H = D / 32;
  for (int64_t qt = 0; qt * 8 < nq; ++qt)
    for (int64_t h = 0; h < H; ++h) {
      __m512 col[16];
      for (int64_t n = 0; n < 8; ++n) amx_query_parts(a, qt * 8 + n, nq, h, &col[n], &col[8 + n], D);
      transpose16(col, col);
      unsigned char* t = qb + (qt * H + h) * TILE_BYTES;
      for (int p = 0; p < 16; ++p) _mm512_store_ps((float*)(t + p * 64), col[p]);
    }
}

/* Sixteen keys' scores for the vectors of tile qt (C: key i's row, the vectors' hi sums
   in columns 0-7, lo in 8-15) into their rows of `scores` at kt: hi + lo. */
AMX_TARGET static inline void amx_scatter_f16(const float* c, float* scores, int64_t qt, int64_t kt, int64_t nq) {
  const int64_t valid = nq - 8 * qt < 8 ? nq - 8 * qt : 8;
  if (valid <= 3) {
    const __m512i rows = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0);
    for (int64_t n = 0; n < valid; ++n)
      _mm512_storeu_ps(scores + (qt * 8 + n) * CHUNK + kt,
                       _mm512_add_ps(_mm512_i32gather_ps(rows, c + n, 4), _mm512_i32gather_ps(rows, c + 8 + n, 4)));
    return;
  }
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(c + 16 * i);
  transpose16(r, r); /* r[n]: column n for the sixteen keys */
  for (int64_t n = 0; n < valid; ++n)
    _mm512_storeu_ps(scores + (qt * 8 + n) * CHUNK + kt, _mm512_add_ps(r[n], r[8 + n]));
}

/* amx_scores for a float16 cache. Each key is hi + lo and each query vector hi + lo
   (bfloat16 each, exact for the key), so a score needs four tile products. With the
   vectors' hi and lo side by side in one tile's columns (eight vectors a tile), two tile
   products per 32 dimensions give all four: the key's hi, then its lo, times both
   halves of the vectors; the columns' two sums are added last. A decode step's three
   vectors then cost two tile products, not four, and a prefill's the same as four
   products over sixteen vectors. Each score is the same sum of the same products in the
   same order whatever the number of vectors. */
AMX_TARGET static void amx_scores_f16(const AmxPart* a, unsigned char* stage, int64_t nq, float* scores,
                                      const int64_t D) {
  const int64_t H = D / 32, groups = (a->reach + 15) / 16;
  unsigned char* qb = stage;
  uint16_t* kbuf = (uint16_t*)(stage + AMX_Q_BYTES); /* two groups of [16][D] hi, then lo */
  float* c = (float*)(stage + AMX_Q_BYTES + AMX_K_BYTES);
  amx_pack_queries_f16(a, qb, nq, D);
  amx_stage_f16(a, 0, kbuf, D);
  int flip = 0;
  int64_t pending_q = -1, pending_k = 0;
  /* one tile of vectors (a decode step) with a head of 64: its two Q tiles stay loaded */
  const int resident = H == 2 && nq <= 8;
  if (resident) {
    _tile_loadd(5, qb, 64);
    _tile_loadd(6, qb + TILE_BYTES, 64);
  }
#define AMX_TILE_F16(C)                                             \
  do {                                                              \
    _tile_zero(C);                                                  \
    for (int64_t h = 0; h < H; ++h) {                               \
      if (resident && h) {                                          \
        _tile_dpbf16ps(C, 2, 6);                                    \
        _tile_dpbf16ps(C, 4, 6);                                    \
        continue;                                                   \
      }                                                             \
      if (!resident) _tile_loadd(5, qb + (qt * H + h) * TILE_BYTES, 64); \
      if (H == 2 && h) {                                            \
        _tile_dpbf16ps(C, 2, 5);                                    \
        _tile_dpbf16ps(C, 4, 5);                                    \
      } else if (H == 2) {                                          \
        _tile_dpbf16ps(C, 1, 5);                                    \
        _tile_dpbf16ps(C, 3, 5);                                    \
      } else {                                                      \
        _tile_loadd(1, kq + 32 * h, 2 * D);                         \
        _tile_loadd(3, kq + 16 * D + 32 * h, 2 * D);                \
        _tile_dpbf16ps(C, 1, 5);                                    \
        _tile_dpbf16ps(C, 3, 5);                                    \
      }                                                             \
    }                                                               \
    _tile_stored(C, c + 256 * ((C) != 0), 64);                      \
  } while (0)
  for (int64_t k = 0; k < groups; ++k) {
    const uint16_t* kq = kbuf + (k & 1) * 2 * 16 * D;
    if (k + 1 < groups) amx_stage_f16(a, k + 1, kbuf + ((k + 1) & 1) * 2 * 16 * D, D);
    if (H == 2) {
      _tile_loadd(1, kq, 2 * D);
      _tile_loadd(2, kq + 32, 2 * D);
      _tile_loadd(3, kq + 16 * D, 2 * D);
      _tile_loadd(4, kq + 16 * D + 32, 2 * D);
    }
    for (int64_t qt = 0; qt * 8 < nq; ++qt) {
      if (flip)
        AMX_TILE_F16(7);
      else
        AMX_TILE_F16(0);
      if (pending_q >= 0) amx_scatter_f16(c + 256 * !flip, scores, pending_q, 16 * pending_k, nq);
      pending_q = qt;
      pending_k = k;
      flip = !flip;
    }
  }
  amx_scatter_f16(c + 256 * !flip, scores, pending_q, 16 * pending_k, nq);
#undef AMX_TILE_F16
}
#undef AMX_Q
#endif

#endif

/* The largest of x[0..n-1] (n > 0). The order it is found in changes nothing that follows:
   maxima are exact, and equal scores of either zero's sign give the same weights. */
static ALWAYS_INLINE float largest(const float* x, int64_t n) {
#ifdef HAVE_X86_PATHS
  if (g_isa == 2) return largest_avx512(x, n);
#endif
  float top[16];
  for (int l = 0; l < 16; ++l) top[l] = -INFINITY;
  int64_t t = 0;
  for (; t + 16 <= n; t += 16)
    for (int l = 0; l < 16; ++l) top[l] = x[t + l] > top[l] ? x[t + l] : top[l];
  float m = top[0];
  for (int l = 1; l < 16; ++l) m = top[l] > m ? top[l] : m;
  for (; t < n; ++t) m = x[t] > m ? x[t] : m;
  return m;
}

#define ROW_N_OUT(s, r, t0) ((int64_t)(s)->totals[r] - (t0))


/* scores[t] = q . K[t] for t < n: each key's dot product on its own (the same bits
   whichever keys are computed with it). */
static ALWAYS_INLINE void dots(const float* q, const float* K, int64_t n, const int64_t D, float* scores) {
#ifdef HAVE_X86_PATHS
  if (g_isa == 2 && D % 16 == 0) {
    dots_avx512(q, K, n, D, scores);
    return;
  }
  if (g_isa >= 1 && D % 8 == 0) {
    dots_avx2(q, K, n, D, scores);
    return;
  }
#endif
  for (int64_t t = 0; t < n; ++t) {
    const float* k = K + t * D;
    float lanes[16] = {0};
    int64_t d = 0;
    for (; d + 16 <= D; d += 16)
      for (int l = 0; l < 16; ++l) lanes[l] += q[d + l] * k[d + l];
    float dot = sum16(lanes);
    for (; d < D; ++d) dot += q[d] * k[d];
    scores[t] = dot;
  }
}

/* acc += sum over t in [from, to) of p[t] * V[t], in order of t. */
static ALWAYS_INLINE void weigh(const float* p, const float* V, int64_t from, int64_t to, float* acc_out,
                                const int64_t D) {
  if (from >= to) return;
  float acc[MAX_HEAD];
  memcpy(acc, acc_out, (size_t)D * sizeof(float));
  for (int64_t t = from; t < to; ++t) {
    const float w = p[t];
    const float* v = V + t * D;
    for (int64_t d = 0; d < D; ++d) acc[d] += w * v[d];
  }
  memcpy(acc_out, acc, (size_t)D * sizeof(float));
}

/* weigh for four query vectors over the same values, t in [0, to): each value row is read
   once for the four. Each accumulator gets the same operations in the same order as
   weigh's. */
static ALWAYS_INLINE void weigh4(const float* const* p, const float* V, int64_t to, float* const* acc_out,
                                 const int64_t D) {
  float a0[MAX_HEAD], a1[MAX_HEAD], a2[MAX_HEAD], a3[MAX_HEAD];
  memcpy(a0, acc_out[0], (size_t)D * sizeof(float));
  memcpy(a1, acc_out[1], (size_t)D * sizeof(float));
  memcpy(a2, acc_out[2], (size_t)D * sizeof(float));
  memcpy(a3, acc_out[3], (size_t)D * sizeof(float));
  const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
  for (int64_t t = 0; t < to; ++t) {
    const float* v = V + t * D;
    const float w0 = p0[t], w1 = p1[t], w2 = p2[t], w3 = p3[t];
    for (int64_t d = 0; d < D; ++d) {
      a0[d] += w0 * v[d];
      a1[d] += w1 * v[d];
      a2[d] += w2 * v[d];
      a3[d] += w3 * v[d];
    }
  }
  memcpy(acc_out[0], a0, (size_t)D * sizeof(float));
  memcpy(acc_out[1], a1, (size_t)D * sizeof(float));
  memcpy(acc_out[2], a2, (size_t)D * sizeof(float));
  memcpy(acc_out[3], a3, (size_t)D * sizeof(float));
}

#ifdef HAVE_X86_PATHS
/* weigh for `n` query vectors over the same values (n * head_size / 16 = 24 registers of
   sums), t in [0, to): each value row is loaded once for the n, and each sum gets weigh's
   operations (a multiply-add per position, in order of t). */
__attribute__((target("avx512f"))) static ALWAYS_INLINE void weigh_n(const float* const* p, const float* V,
                                                                   int64_t to, float* const* acc_out,
                                                                   const int64_t D, const int n) {
  const int z = (int)(D / 16);
  __m512 a[24];
  for (int e = 0; e < n; ++e)
    for (int j = 0; j < z; ++j) a[e * z + j] = _mm512_loadu_ps(acc_out[e] + 16 * j);
  for (int64_t t = 0; t < to; ++t) {
    const float* v = V + t * D;
    __m512 row[8];
    for (int j = 0; j < z; ++j) row[j] = _mm512_loadu_ps(v + 16 * j);
    for (int e = 0; e < n; ++e) {
      const __m512 w = _mm512_set1_ps(p[e][t]);
      for (int j = 0; j < z; ++j) a[e * z + j] = _mm512_fmadd_ps(w, row[j], a[e * z + j]);
    }
  }
  for (int e = 0; e < n; ++e)
    for (int j = 0; j < z; ++j) _mm512_storeu_ps(acc_out[e] + 16 * j, a[e * z + j]);
}

/* How many query vectors the explicit weighted sums take a pass for head size D: weigh_zmm
   (AVX-512), weigh_ymm (AVX2); 0: neither does, weigh4 does. */
#define WEIGH_WIDE(D) (g_isa == 2 ? ((D) == 64 ? 6 : (D) == 128 ? 3 : 0) : g_isa == 1 && (D) % 32 == 0 ? 2 : 0)

__attribute__((target("avx512f"), noinline)) static void weigh_zmm(const float* const* p, const float* V, int64_t to,
                                                                  float* const* acc_out, int64_t D) {
  if (D == 64)
    weigh_n(p, V, to, acc_out, 64, 6);
  else
    weigh_n(p, V, to, acc_out, 128, 3);
}

/* weigh_n over a float16 cache's values, t in [from, to): each row converted in registers
   as it is loaded (a conversion is exact), so each sum gets weigh's operations on the same
   floats without the tile of floats written and read back. */
__attribute__((target("avx512f"))) static ALWAYS_INLINE void weigh_n_f16(const float* const* p, const uint16_t* V,
                                                                       int64_t from, int64_t to,
                                                                       float* const* acc_out, const int64_t D,
                                                                       const int n) {
  const int z = (int)(D / 16);
  __m512 a[24];
  for (int e = 0; e < n; ++e)
    for (int j = 0; j < z; ++j) a[e * z + j] = _mm512_loadu_ps(acc_out[e] + 16 * j);
  for (int64_t t = from; t < to; ++t) {
    const uint16_t* v = V + t * D;
    __m512 row[8];
    for (int j = 0; j < z; ++j) row[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(v + 16 * j)));
    for (int e = 0; e < n; ++e) {
      const __m512 w = _mm512_set1_ps(p[e][t]);
      for (int j = 0; j < z; ++j) a[e * z + j] = _mm512_fmadd_ps(w, row[j], a[e * z + j]);
    }
  }
  for (int e = 0; e < n; ++e)
    for (int j = 0; j < z; ++j) _mm512_storeu_ps(acc_out[e] + 16 * j, a[e * z + j]);
}

/* The weighted sums of `nv` query vectors over one batch row's float16 values (AVX-512,
   a head of 64 or 128): up to WEIGH_WIDE(D) vectors a pass over their common positions,
   then each vector's own remaining ones. A decode step's three vectors take one pass. */
__attribute__((target("avx512f"), noinline)) static void weigh_f16(const float* const* p, const uint16_t* V,
                                                                  const int64_t* to, float* const* acc_out,
                                                                  int64_t nv, int64_t D) {
  const int64_t wide = D == 64 ? 6 : 3;
  for (int64_t i = 0; i < nv; i += wide) {
    const int64_t n = nv - i < wide ? nv - i : wide;
    int64_t common = to[i];
    for (int64_t e = i + 1; e < i + n; ++e) common = to[e] < common ? to[e] : common;
#define WEIGH_F16_N(N)                                                        \
  case N:                                                                     \
    if (D == 64)                                                              \
      weigh_n_f16(p + i, V, 0, common, acc_out + i, 64, N);                   \
    else                                                                      \
      weigh_n_f16(p + i, V, 0, common, acc_out + i, 128, N < 3 ? N : 3);     \
    break;
    switch (n) {
      WEIGH_F16_N(1)
      WEIGH_F16_N(2)
      WEIGH_F16_N(3)
      WEIGH_F16_N(4)
      WEIGH_F16_N(5)
      WEIGH_F16_N(6)
    }
#undef WEIGH_F16_N
    for (int64_t e = i; e < i + n; ++e)
      if (to[e] > common) {
        if (D == 64)
          weigh_n_f16(p + e, V, common, to[e], acc_out + e, 64, 1);
        else
          weigh_n_f16(p + e, V, common, to[e], acc_out + e, 128, 1);
      }
  }
}
#else
#define WEIGH_WIDE(D) 0
#endif

#ifdef HAVE_X86_PATHS
/* exp_neg's steps on eight lanes (AVX2 and FMA): the compiler leaves exp_neg's loop scalar
   where AVX-512 is not there to build it (measured: 30% of a prefill's attention). */
__attribute__((target("avx2,fma"))) static inline __m256 exp_neg8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 big = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), big), big);
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f),
                                   _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* x[t] = exp_neg8(x[t] - m) for t < n, every position through the same lanes' code (the
   last few by a masked load and store). */
__attribute__((target("avx2,fma"))) static void exps_avx2(float* x, int64_t n, float m) {
  const __m256 mm = _mm256_set1_ps(m);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) _mm256_storeu_ps(x + t, exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(x + t), mm)));
  if (t < n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - t)), lane);
    const __m256 v = _mm256_maskload_ps(x + t, keep);
    _mm256_maskstore_ps(x + t, keep, exp_neg8(_mm256_sub_ps(v, mm)));
  }
}

/* weigh for two query vectors over the same values in AVX2, a quarter-register block of
   32 dimensions at a time (eight registers of sums, the values' row loaded once for the
   two): each sum gets weigh's multiply-add per position, in order of t. */
__attribute__((target("avx2,fma"), noinline)) static void weigh_ymm(const float* const* p, const float* V,
                                                                   int64_t to, float* const* acc_out, int64_t D) {
  for (int64_t h = 0; h < D; h += 32) {
    __m256 a[8];
    for (int e = 0; e < 2; ++e)
      for (int j = 0; j < 4; ++j) a[e * 4 + j] = _mm256_loadu_ps(acc_out[e] + h + 8 * j);
    for (int64_t t = 0; t < to; ++t) {
      const float* v = V + t * D + h;
      const __m256 r0 = _mm256_loadu_ps(v), r1 = _mm256_loadu_ps(v + 8), r2 = _mm256_loadu_ps(v + 16),
                   r3 = _mm256_loadu_ps(v + 24);
      for (int e = 0; e < 2; ++e) {
        const __m256 w = _mm256_set1_ps(p[e][t]);
        a[e * 4] = _mm256_fmadd_ps(w, r0, a[e * 4]);
        a[e * 4 + 1] = _mm256_fmadd_ps(w, r1, a[e * 4 + 1]);
        a[e * 4 + 2] = _mm256_fmadd_ps(w, r2, a[e * 4 + 2]);
        a[e * 4 + 3] = _mm256_fmadd_ps(w, r3, a[e * 4 + 3]);
      }
    }
    for (int e = 0; e < 2; ++e)
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(acc_out[e] + h + 8 * j, a[e * 4 + j]);
  }
}

/* exp_neg8's steps on sixteen lanes (AVX-512): the same operations in the same order. */
__attribute__((target("avx512f"))) static inline __m512 exp_neg16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 big = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), big), big);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                   _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  /* p * 2^n in one instruction: n is a whole number in [-126, 0], so 2^n is a normal float
     and the product is exp_neg's p * scale, rounded once the same way */
  return _mm512_scalef_ps(p, n);
}

/* x[t] = exp_neg(x[t] - m) for t < n, and their sum as attend adds them (sixteen lanes over
   the whole blocks in order, sum16, then the rest one by one): one pass instead of two. */
__attribute__((target("avx512f"))) static float exps_sum_avx512(float* x, int64_t n, float m) {
  const __m512 mm = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(x + t), mm));
    _mm512_storeu_ps(x + t, e);
    acc = _mm512_add_ps(acc, e);
  }
  float lanes[16];
  _mm512_storeu_ps(lanes, acc);
  float sum = sum16(lanes);
  if (t < n) {
    const __mmask16 keep = (__mmask16)((1u << (n - t)) - 1u);
    _mm512_mask_storeu_ps(x + t, keep, exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(keep, x + t), mm)));
    for (; t < n; ++t) sum += x[t];
  }
  return sum;
}
#endif

/* x[t] = exp_neg(x[t] - m) for t < n (its AVX2 lanes on that path: one code per path). */
static ALWAYS_INLINE void exps(float* x, int64_t n, float m) {
#ifdef HAVE_X86_PATHS
  if (g_isa == 1) {
    exps_avx2(x, n, m);
    return;
  }
#endif
  for (int64_t t = 0; t < n; ++t) x[t] = exp_neg(x[t] - m);
}

/* One piece of work: the query heads of one KV head for rows r0..r1-1, over one chunk of
   positions, into partials of head_size + 2 floats (acc..., max, sum): row r's query head
   j at out + (r - r0) * row_stride + j * head_stride. The chunk is walked in tiles, each
   tile's keys (then values) read from memory once for all the block's query vectors and
   kept in the first-level cache meanwhile. `scratch` holds (r1 - r0) * group *
   (CHUNK + D) floats. Inlined with D a constant for the common head sizes.

   A row's partials depend only on its query, its total and the cache, never on the other
   rows of the block, the tiles or the threads: each dot product is computed on its own,
   the softmax and the weighted sum of values go through the row's positions in order. So
   a token gets the same bits alone in a decode step or among the rows of a prefill chunk.

   With a float16 or int8 cache (`kind`, a constant), each tile of a batch row's keys or
   values is converted to floats (float16 exactly; int8 as q * scale) into `tile` once for
   all the query vectors that read it, and the same code then runs on the floats: the same
   bits as a float32 cache holding those values. */
static ALWAYS_INLINE void attend(const Step* s, int64_t r0, int64_t r1, int64_t g, int64_t chunk, float* out,
                                 int64_t row_stride, int64_t head_stride, float* scratch, const int64_t D,
                                 const int kind) {
  const int64_t t0 = chunk * CHUNK, G = s->group, rows = r1 - r0;
  float* scores = scratch;                   /* [rows * G][CHUNK] */
  float* accs = scratch + rows * G * CHUNK;  /* [rows * G][D] */
  float* tile = accs + rows * G * D;         /* kind != KV_F32: [TILE][D], one tile as floats */
  int seen = 0; /* a row of the block attends to a position of this chunk */
  for (int64_t r = r0; r < r1 && !seen; ++r) seen = ROW_FIRST(s, r) < t0 + CHUNK && s->totals[r] > t0;
  if (!seen) { /* every row's partial empty: before its window or past its end */
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < G; ++j) {
        float* o = out + (r - r0) * row_stride + j * head_stride;
        memset(o, 0, (size_t)D * sizeof(float));
        o[D] = -INFINITY;
        o[D + 1] = 0.0f;
      }
    return;
  }
  int64_t longest = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = (int64_t)s->totals[r] - t0;
    longest = n > longest ? n : longest;
  }
  longest = longest < CHUNK ? longest : CHUNK;
#define ROW_N(r) ((int64_t)s->totals[r] - t0 < CHUNK ? (int64_t)s->totals[r] - t0 : CHUNK)
#define KV_AT(base, r, t) \
  ((const float*)(base) + ((((r) / s->seq) * s->kv_heads + g) * s->capacity + t0 + (t)) * D)
  /* a float16 or int8 cache's row t of chunk t0 for row r (its batch row, KV head g) */
#define KVC_AT(base, r, t) \
  ((const char*)cache_row(kind, (void*)(base), (((r) / s->seq) * s->kv_heads + g) * s->capacity + t0 + (t), D))
  /* The end of row r's batch row in the block (its rows' totals grow with r). */
#define BATCH_END(r) ((((r) / s->seq) + 1) * s->seq < r1 ? (((r) / s->seq) + 1) * s->seq : r1)
  /* tile ts of row r's batch row into `tile`, as far as the block's rows of it read. */
#define CONVERT_TILE(base, r, ts)                                                              \
  do {                                                                                         \
    const int64_t reach_ = ROW_N(BATCH_END(r) - 1) - (ts), m_ = reach_ < TILE ? reach_ : TILE; \
    cache_rows_to_floats(kind, KVC_AT(base, r, ts), m_, D, tile);                              \
  } while (0)
  /* The scores, tile by tile: the tile's keys are read once for the block. Where many
     query vectors read one batch row's tile (a prefill chunk), the tile is transposed and
     the keys' dot products computed sixteen keys to a register (dots_t16; AVX2: eight,
     dots_t8): the same bits as `dots`, without its per-key reductions. */
  /* the limit of a query's whole numbers for an int16 cache (D products a sum) */
  const float M = kind == KV_I16 ? (float)i16_limit(D) : 0.0f;
#ifdef HAVE_X86_PATHS
  /* its scores and weighted sums on VPDPWSSD (g_vnni), else in plain C; the limit of the
     weights' whole numbers (TILE products a sum) */
  const int i16 = kind == KV_I16 && g_vnni && D % 32 == 0 && D <= MAX_HEAD;
  const float Mt = i16 ? (float)i16_limit(TILE) : 0.0f;
#endif
#ifdef HAVE_AMX
  /* an int8 or float16 cache's scores on AMX tiles, where the CPU has them (amx_scores) */
  const int amx = g_amx && (kind == KV_F16 || kind == KV_I8) && (D == 64 || D == 128);
  unsigned char* stage = amx ? amx_scratch() : NULL;
  if (amx && stage == NULL) {
    ((Step*)s)->failed = 1; /* the run reports it */
    return;
  }
  if (amx) {
    amx_begin();
    for (int64_t ra = r0, rb; ra < r1; ra = rb) {
      rb = BATCH_END(ra);
      const AmxPart part = {s, ra, rb, g, t0, ROW_N(rb - 1), KVC_AT(s->keys, ra, 0), kind};
      if (part.reach > 0 && kind == KV_F16)
        amx_scores_f16(&part, stage, (rb - ra) * G, scores + (ra - r0) * G * CHUNK, D);
      else if (part.reach > 0)
        amx_scores(&part, stage, (rb - ra) * G, scores + (ra - r0) * G * CHUNK, D);
    }
    amx_end();
  } else
#endif
  {
  /* the block's query vectors as whole numbers first, into `accs` (free until the
     weighted sums, which clear it) */
  int32_t* qq = (int32_t*)accs;                /* [rows * G][D] int16, by pairs */
  float* qs = accs + rows * G * ((D + 1) / 2); /* [rows * G] */
  if (kind == KV_I16)
    for (int64_t v = 0; v < rows * G; ++v)
      qs[v] = i16_query_rows(s->q + ((r0 + v / G) * s->heads + g * G + v % G) * D, D, M, (int16_t*)qq + v * D);
  for (int64_t ts = 0; ts < longest; ts += TILE) {
    int64_t converted = -1; /* the batch row whose tile ts is in `tile` */
    for (int64_t ra = r0, rb; ra < r1; ra = rb) {
      rb = BATCH_END(ra);
      const int64_t reach = ROW_N(rb - 1) - ts; /* the segment's last row reads furthest */
      if (reach <= 0) continue;
#ifdef HAVE_X86_PATHS
      if (i16) { /* the tile's keys as whole numbers (kt, scales sk), then every vector's dots */
        const int64_t mt = reach < TILE ? reach : TILE, groups = mt > 2 * 16 ? 4 : 2;
        int32_t* kt = (int32_t*)tile; /* [D / 2][TILE] */
        float* sk = tile + TILE * (D / 2);
        for (int64_t k0 = 0; k0 < 16 * groups; k0 += 16)
          I16_CALL(row_keys, (const int16_t*)KVC_AT(s->keys, ra, ts) + k0 * I16_ROW(D),
                                                        mt - k0, D, kt + k0, sk + k0);
        const int32_t* qv[MAX_VECTORS];
        float qsv[MAX_VECTORS];
        float* sv[MAX_VECTORS];
        int64_t nq = 0;
        for (int64_t r = ra; r < rb; ++r) {
          if (ROW_N(r) <= ts) continue;
          for (int64_t j = 0; j < G; ++j, ++nq) {
            const int64_t v = (r - r0) * G + j;
            qv[nq] = qq + v * (D / 2);
            qsv[nq] = qs[v];
            sv[nq] = scores + v * CHUNK + ts;
          }
        }
        I16_CALL(dots, qv, qsv, sv, nq, kt, sk, groups, D);
        continue;
      }
      const int wide = g_isa == 2 && D % 16 == 0,
                narrow = g_isa == 1 && D % 8 == 0 && (kind != KV_F16 || g_half >= 1);
      if ((wide || narrow) && kind != KV_I16 && (rb - ra) * G >= TRANSPOSED_FROM) {
        const int64_t mt = reach < TILE ? reach : TILE;
        const void* src = kind ? (const void*)KVC_AT(s->keys, ra, ts) : (const void*)KV_AT(s->keys, ra, ts);
        if (wide)
          transpose_tile(src, kind, mt, D, tile);
        else
          transpose_tile_avx2(src, kind, mt, D, tile);
        converted = -1;
        const float* qv[MAX_VECTORS];
        float* sv[MAX_VECTORS];
        int64_t nq = 0;
        for (int64_t r = ra; r < rb; ++r) {
          if (ROW_N(r) <= ts) continue;
          for (int64_t j = 0; j < G; ++j, ++nq) {
            qv[nq] = s->q + (r * s->heads + g * G + j) * D;
            sv[nq] = scores + ((r - r0) * G + j) * CHUNK + ts;
          }
        }
        if (wide)
          dots_t16(qv, sv, nq, tile, (mt + 15) / 16, D);
        else
          dots_t8(qv, sv, nq, tile, mt > 16 ? 8 : 2, D);
        continue;
      }
#endif
      for (int64_t r = ra; r < rb; ++r) {
        const int64_t n = ROW_N(r);
        if (n <= ts) continue;
        const int64_t m = n - ts < TILE ? n - ts : TILE;
        if (kind == KV_I16) { /* whole numbers in plain C (the same numbers as i16_dots) */
          for (int64_t j = 0; j < G; ++j) {
            const int64_t v = (r - r0) * G + j;
            i16_row_dots((const int16_t*)qq + v * D, qs[v], (const int16_t*)KVC_AT(s->keys, r, ts), m, D,
                         scores + v * CHUNK + ts);
          }
          continue;
        }
        const float* keys;
        if (kind) {
          if (r / s->seq != converted) {
            CONVERT_TILE(s->keys, r, ts);
            converted = r / s->seq;
          }
          keys = tile;
        } else {
          keys = KV_AT(s->keys, r, ts);
        }
        for (int64_t j = 0; j < G; ++j)
          dots(s->q + (r * s->heads + g * G + j) * D, keys, m, D, scores + ((r - r0) * G + j) * CHUNK + ts);
      }
    }
  }
  }
  float sums[MAX_VECTORS], tops[MAX_VECTORS];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = ROW_N(r);
    /* a sliding window: the positions before its start weigh exactly 0 */
    const int64_t first = ROW_FIRST(s, r) > t0 ? ROW_FIRST(s, r) - t0 : 0;
    for (int64_t j = 0; j < G; ++j) {
      float* sc = scores + ((r - r0) * G + j) * CHUNK;
      float* acc = accs + ((r - r0) * G + j) * D;
      for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
      if (n <= first) continue;
      const float m = largest(sc + first, n - first);
      tops[(r - r0) * G + j] = m;
#ifdef HAVE_X86_PATHS
      if (g_isa == 2 && first == 0) {
        sums[(r - r0) * G + j] = exps_sum_avx512(sc, n, m);
        continue;
      }
#endif
      int64_t t;
      for (t = 0; t < first; ++t) sc[t] = 0.0f;
      exps(sc + first, n - first, m);
      float lanes[16] = {0};
      for (t = 0; t + 16 <= n; t += 16)
        for (int l = 0; l < 16; ++l) lanes[l] += sc[t + l];
      float sum = sum16(lanes);
      for (; t < n; ++t) sum += sc[t];
      sums[(r - r0) * G + j] = sum;
    }
  }
  /* The weighted sums of values, query vectors four at a time where they read the same
     values: each value row is loaded once for four accumulators, each still the sum over
     its positions in order (so the same bits as one at a time). */
  for (int64_t ts = 0; ts < longest; ts += TILE)
   /* float32: the block at once; else each batch row's rows, its tile converted first */
   for (int64_t ra = r0, rb; ra < r1; ra = rb) {
    rb = kind ? BATCH_END(ra) : r1;
    if (kind) {
      if (ROW_N(rb - 1) <= ts) continue;
#ifdef HAVE_X86_PATHS
      if (i16) { /* the tile's values as whole numbers (vt, scales sv), then six vectors at a time */
        const int64_t reach = ROW_N(rb - 1) - ts, mt = reach < TILE ? reach : TILE, len = (mt + 31) / 32 * 32;
        int32_t* vt = (int32_t*)tile;          /* [TILE / 2][D] */
        float* sv = tile + TILE * (D / 2);
        for (int64_t v0 = 0; v0 < len; v0 += 16)
          I16_CALL(row_values, (const int16_t*)KVC_AT(s->values, ra, ts) + v0 * I16_ROW(D),
                                                            mt - v0, D, vt + (v0 / 2) * D, sv + v0);
        int32_t wbuf[6 * (TILE / 2)];
        const int32_t* wq[6];
        float sw[6];
        float* wa[6];
        int64_t nw = 0;
        for (int64_t r = ra; r < rb; ++r) {
          const int64_t n = ROW_N(r);
          if (n <= ts) continue;
          for (int64_t j = 0; j < G; ++j) {
            const int64_t v = (r - r0) * G + j;
            wq[nw] = wbuf + nw * (TILE / 2);
            sw[nw] = I16_CALL(weights, scores + v * CHUNK + ts, sv, n - ts, len, Mt,
                                                                wbuf + nw * (TILE / 2));
            wa[nw] = accs + v * D;
            if (++nw == 6) {
              I16_CALL(weigh, wq, sw, vt, len / 2, wa, nw, D);
              nw = 0;
            }
          }
        }
        if (nw > 0) I16_CALL(weigh, wq, sw, vt, len / 2, wa, nw, D);
        continue;
      }
      /* a float16 cache's values for a few vectors: converted in registers (weigh_f16) */
      if (kind == KV_F16 && g_isa == 2 && (D == 64 || D == 128)) {
        const float* fp[MAX_VECTORS];
        float* fa[MAX_VECTORS];
        int64_t fm[MAX_VECTORS];
        int64_t nf = 0;
        for (int64_t r = ra; r < rb; ++r) {
          const int64_t n = ROW_N(r);
          if (n <= ts) continue;
          for (int64_t j = 0; j < G; ++j, ++nf) {
            fp[nf] = scores + ((r - r0) * G + j) * CHUNK + ts;
            fa[nf] = accs + ((r - r0) * G + j) * D;
            fm[nf] = n - ts < TILE ? n - ts : TILE;
          }
        }
        if (nf <= WEIGH_WIDE(D)) { /* one pass (a decode step); more convert the tile once */
          weigh_f16(fp, (const uint16_t*)KVC_AT(s->values, ra, ts), fm, fa, nf, D);
          continue;
        }
      }
#endif
      if (kind == KV_I16) { /* whole numbers in plain C (the same numbers as i16_weigh) */
        for (int64_t r = ra; r < rb; ++r) {
          const int64_t n = ROW_N(r);
          if (n <= ts) continue;
          for (int64_t j = 0; j < G; ++j)
            i16_row_weigh(scores + ((r - r0) * G + j) * CHUNK + ts, (const int16_t*)KVC_AT(s->values, r, ts),
                          n - ts < TILE ? n - ts : TILE, D, accs + ((r - r0) * G + j) * D);
        }
        continue;
      }
      CONVERT_TILE(s->values, ra, ts);
    }
    const float* vp[MAX_VECTORS];
    float* va[MAX_VECTORS];
    const float* vv[MAX_VECTORS];
    int64_t vm[MAX_VECTORS];
    int64_t nv = 0;
    for (int64_t r = ra; r < rb; ++r) {
      const int64_t n = ROW_N(r);
      if (n <= ts) continue;
      for (int64_t j = 0; j < G; ++j, ++nv) {
        vp[nv] = scores + ((r - r0) * G + j) * CHUNK + ts;
        va[nv] = accs + ((r - r0) * G + j) * D;
        vv[nv] = kind ? tile : KV_AT(s->values, r, ts);
        vm[nv] = n - ts < TILE ? n - ts : TILE;
      }
    }
    /* AVX-512 with a head of 64 or 128: six or three query vectors a pass (weigh_zmm);
       AVX2 with a head a multiple of 32: two (weigh_ymm) */
    const int64_t w = WEIGH_WIDE(D);
    const int64_t at_once = w ? w : 4;
    int64_t i = 0;
    for (; i + at_once <= nv; i += at_once) {
      int same = 1;
      for (int64_t e = i + 1; e < i + at_once; ++e) same = same && vv[e] == vv[i];
      if (!same) {
        for (int64_t e = i; e < i + at_once; ++e) weigh(vp[e], vv[e], 0, vm[e], va[e], D);
        continue;
      }
      int64_t common = vm[i];
      for (int64_t e = i + 1; e < i + at_once; ++e) common = vm[e] < common ? vm[e] : common;
#ifdef HAVE_X86_PATHS
      if (w && g_isa == 1)
        weigh_ymm(vp + i, vv[i], common, va + i, D);
      else if (w)
        weigh_zmm(vp + i, vv[i], common, va + i, D);
      else
#endif
        weigh4(vp + i, vv[i], common, va + i, D);
      for (int64_t e = i; e < i + at_once; ++e) weigh(vp[e], vv[e], common, vm[e], va[e], D);
    }
    for (; i < nv; ++i) weigh(vp[i], vv[i], 0, vm[i], va[i], D);
  }
#undef ROW_N
#undef KV_AT
#undef KVC_AT
#undef BATCH_END
#undef CONVERT_TILE
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = ROW_N_OUT(s, r, t0), first = ROW_FIRST(s, r) - t0;
    for (int64_t j = 0; j < G; ++j) {
      float* o = out + (r - r0) * row_stride + j * head_stride;
      const int64_t v = (r - r0) * G + j;
      memcpy(o, accs + v * D, (size_t)D * sizeof(float));
      const int empty = n <= 0 || first >= (n < CHUNK ? n : CHUNK); /* no position of this chunk */
      o[D] = empty ? -INFINITY : tops[v];
      o[D + 1] = empty ? 0.0f : sums[v];
    }
  }
}

/* Every path runs a block's chunk through this one compiled function (never inlined into
   its callers, whose code generation could differ), so a row gets the same bits whether it
   runs alone in a decode step or among the rows of a prefill chunk or a check. */
HOT __attribute__((noinline)) static void attend_piece(const Step* s, int64_t r0, int64_t r1, int64_t g,
                                                       int64_t chunk, float* out, int64_t row_stride,
                                                       int64_t head_stride, float* scratch) {
#define ATTEND_KIND(KIND)                                                                                    \
  switch (s->head_size) {                                                                                    \
    case 64: attend(s, r0, r1, g, chunk, out, row_stride, head_stride, scratch, 64, KIND); break;            \
    case 128: attend(s, r0, r1, g, chunk, out, row_stride, head_stride, scratch, 128, KIND); break;          \
    default: attend(s, r0, r1, g, chunk, out, row_stride, head_stride, scratch, s->head_size, KIND); break; \
  }
  if (s->kind == KV_F16) {
    ATTEND_KIND(KV_F16)
  } else if (s->kind == KV_I8) {
    ATTEND_KIND(KV_I8)
  } else if (s->kind == KV_I16) {
    ATTEND_KIND(KV_I16)
  } else {
    ATTEND_KIND(KV_F32)
  }
#undef ATTEND_KIND
}

/* A row's attention for one query head from its chunks' partials (`chunks` of them, D + 2
   floats each): rescaled to the largest maximum, then normalised. Empty chunks (a sum of
   0) add nothing. One compiled function for every path, like attend_piece. */
__attribute__((noinline)) static void combine(const float* parts, int64_t chunks, int64_t D, float* o) {
  float m = -INFINITY;
  for (int64_t c = 0; c < chunks; ++c) m = parts[c * (D + 2) + D] > m ? parts[c * (D + 2) + D] : m;
  memset(o, 0, (size_t)D * sizeof(float));
  float sum = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* part = parts + c * (D + 2);
    if (part[D + 1] == 0.0f) continue;
    const float w = expf(part[D] - m);
    sum += w * part[D + 1];
    for (int64_t d = 0; d < D; ++d) o[d] += w * part[d];
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < D; ++d) o[d] *= inv;
}

/* Chunk tasks (a decode step: few rows, so the positions are split among the threads):
   task = (row, KV head, chunk); the partials are combined after all tasks. */
static void attend_chunk(void* data, size_t task) {
  Step* s = (Step*)data;
  const int64_t chunk = (int64_t)task % s->chunks;
  const int64_t g = ((int64_t)task / s->chunks) % s->kv_heads;
  const int64_t r = (int64_t)task / (s->chunks * s->kv_heads);
  const int64_t D = s->head_size;
  float* out = s->partial + ((r * s->heads + g * s->group) * s->chunks + chunk) * (D + 2);
  float small[4 * (CHUNK + MAX_HEAD) + TILE * 64]; /* and a tile (float16 as floats, or transposed) of head size 64 or less */
  const size_t need = (size_t)(s->group * (CHUNK + D) + TILE * D);
  float* scratch = need <= sizeof small / sizeof small[0] ? small : (float*)malloc(need * sizeof(float));
  if (scratch == NULL) {
    s->failed = 1;
    return;
  }
  attend_piece(s, r, r + 1, g, chunk, out, 0, s->chunks * (D + 2), scratch);
  if (scratch != small) free(scratch);
}

/* Row tasks (a prefill chunk or a check: many rows): task = (ROW_BLOCK consecutive rows,
   KV head). The task walks the chunks in order and runs each chunk for all its rows, so
   the chunk's keys and values are read from memory once for the block, then combines
   each row's partials itself, in its own scratch. */
#define ROW_BLOCK 64 /* at most; rows x group <= MAX_VECTORS (row_block) */
/* Row tasks the threads share at least before a run takes chunk tasks instead. */
#define ROW_TASKS_PER_THREAD 4

/* Rows per row task for R rows: up to ROW_BLOCK, as many as MAX_VECTORS query vectors
   allow, halved down to 8 rows while that leaves the threads fewer than
   2 * ROW_TASKS_PER_THREAD tasks (a prefill's short last chunk: its rows still take the
   transposed dot products of a block instead of one row's each). The block changes no
   bits: a row's partials never depend on the other rows of its block. */
static inline int enough_row_tasks(int64_t R, int64_t block, int64_t kv_heads) {
  return ((R + block - 1) / block) * kv_heads >= ROW_TASKS_PER_THREAD * 2;
}

static inline int64_t row_block(int64_t group, int64_t R, int64_t kv_heads) {
  const int64_t n = MAX_VECTORS / group;
  int64_t block = n < ROW_BLOCK ? n : ROW_BLOCK;
  while (block > 8 && !enough_row_tasks(R, block, kv_heads)) block = (block + 1) / 2;
  return block;
}

static void attend_rows(void* data, size_t task) {
  Step* s = (Step*)data;
  const int64_t g = (int64_t)task % s->kv_heads;
  const int64_t block = s->block;
  const int64_t r0 = ((int64_t)task / s->kv_heads) * block;
  const int64_t r1 = r0 + block < s->rows ? r0 + block : s->rows;
  const int64_t D = s->head_size, G = s->group;
  int64_t chunks = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t c = ((int64_t)s->totals[r] + CHUNK - 1) / CHUNK;
    chunks = c > chunks ? c : chunks;
  }
  const int64_t per_head = chunks * (D + 2);
  float* parts = (float*)malloc((size_t)((r1 - r0) * G * (per_head + CHUNK + D) + TILE * D) *
                                sizeof(float));
  if (parts == NULL) {
    s->failed = 1;
    return;
  }
  float* scratch = parts + (r1 - r0) * G * per_head;
  for (int64_t c = 0; c < chunks; ++c)
    attend_piece(s, r0, r1, g, c, parts + c * (D + 2), G * per_head, per_head, scratch);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t own = ((int64_t)s->totals[r] + CHUNK - 1) / CHUNK;
    for (int64_t j = 0; j < G; ++j)
      combine(parts + ((r - r0) * G + j) * per_head, own, D, s->out + (r * s->heads + g * G + j) * D);
  }
  free(parts);
}

static void rotate(float* x, const float* cos_row, const float* sin_row, int64_t rotary_dim, int interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_row[i], s = sin_row[i];
    float* a = interleaved ? x + 2 * i : x + i;
    float* b = interleaved ? x + 2 * i + 1 : x + i + half;
    const float x1 = *a, x2 = *b;
    *a = x1 * c - x2 * s;
    *b = x2 * c + x1 * s;
  }
}

typedef struct Tensor {
  float* data;
  int64_t dims[4];
  size_t rank;
  int elem;
} Tensor;

static OrtStatus* describe(const OrtValue* value, Tensor* t) {
  return tensor_info(value, (void**)&t->data, &t->elem, t->dims, 4, &t->rank,
                     "GroupQueryAttention: tensor of rank above 4");
}

static int64_t read_scalar(const OrtValue* value) {
  Tensor t;
  OrtStatus* status = describe(value, &t);
  if (status != NULL) {
    API(ReleaseStatus)(status);
    return -1;
  }
  return t.elem == ELEM_INT32 ? (int64_t)((const int32_t*)t.data)[0] : -1;
}

/* ONNX Runtime's own kernel, given outputs of the shapes it computes (InvokeOp wants them
   allocated): output [batch, sequence, heads * head_size] and the present caches
   [batch, kv_heads, max(total length, past buffer), head_size]. */
/* Runs handed to ONNX Runtime's kernel (EngineKernelsFallbacks): shapes or attributes this
   code does not cover. */
static volatile long g_fallbacks;

static OrtStatus* run_fallback(const Kernel* k, OrtKernelContext* context, const OrtValue** inputs) {
  __atomic_add_fetch(&g_fallbacks, 1, __ATOMIC_RELAXED);
  Tensor query, past;
  TRY(describe(inputs[0], &query));
  if (query.rank != 3) return fail("GroupQueryAttention: query must be [batch, sequence, hidden]");
  const int64_t width = query.dims[2];
  const int64_t D = inputs[1] == NULL ? width / (k->num_heads + 2 * k->kv_num_heads) : width / k->num_heads;
  const int64_t total = read_scalar(inputs[6]);
  int64_t present_len = total;
  if (inputs[3] != NULL) {
    TRY(describe(inputs[3], &past));
    if (past.rank == 4 && past.dims[2] > present_len) present_len = past.dims[2];
  }
  const int64_t out_dims[3] = {query.dims[0], query.dims[1], k->num_heads * D};
  const int64_t kv_dims[4] = {query.dims[0], k->kv_num_heads, present_len, D};
  OrtValue* outputs[N_OUTPUTS] = {0};
  TRY(API(KernelContext_GetOutput)(context, 0, out_dims, 3, &outputs[0]));
  TRY(API(KernelContext_GetOutput)(context, 1, kv_dims, 4, &outputs[1]));
  TRY(API(KernelContext_GetOutput)(context, 2, kv_dims, 4, &outputs[2]));
  return API(InvokeOp)(context, k->fallback, inputs, N_INPUTS, outputs, N_OUTPUTS);
}

/* run_fallback for a float16 or int8 cache: ONNX Runtime's fp32 kernel on float32 copies
   of the past caches, into float32 presents that are then stored back in the cache's
   element (rounded to float16; quantized row by row to int8 or int16). (The attention reads the new
   keys and values before their rounding here; the engine's own runs never come this way.) */
static OrtStatus* run_fallback_cast(const Kernel* k, OrtKernelContext* context, const OrtValue** inputs) {
  __atomic_add_fetch(&g_fallbacks, 1, __ATOMIC_RELAXED);
  const int i8 = k->kind == KV_I8, i16 = k->kind == KV_I16;
  Tensor query, past[2] = {{0}, {0}};
  TRY(describe(inputs[0], &query));
  if (query.rank != 3)
    return fail(i8    ? "GroupQueryAttentionI8KV: query must be [batch, sequence, hidden]"
                : i16 ? "GroupQueryAttentionI16KV: query must be [batch, sequence, hidden]"
                      : "GroupQueryAttentionF16KV: query must be [batch, sequence, hidden]");
  const int64_t width = query.dims[2];
  const int64_t D = inputs[1] == NULL ? width / (k->num_heads + 2 * k->kv_num_heads) : width / k->num_heads;
  const int64_t row = i8 ? I8_ROW(D) : i16 ? I16_ROW(D) : D; /* the cache's last dimension */
  const int64_t total = read_scalar(inputs[6]);
  int64_t present_len = total;
  for (int i = 0; i < 2; ++i) {
    if (inputs[3 + i] == NULL) continue;
    TRY(describe(inputs[3 + i], &past[i]));
    if (past[i].elem != (i8 ? ELEM_INT8 : i16 ? ELEM_INT16 : ELEM_FLOAT16) || past[i].rank != 4 ||
        past[i].dims[3] != row)
      return fail(i8    ? "GroupQueryAttentionI8KV: past_key and past_value must be int8 [batch, kv_heads, length, "
                          "head_size + 2]"
                  : i16 ? "GroupQueryAttentionI16KV: past_key and past_value must be int16 [batch, kv_heads, "
                          "length, head_size + 1]"
                        : "GroupQueryAttentionF16KV: past_key and past_value must be float16 [batch, kv_heads, "
                          "length, head_size]");
    if (past[i].dims[2] > present_len) present_len = past[i].dims[2];
  }
  const int64_t out_dims[3] = {query.dims[0], query.dims[1], k->num_heads * D};
  const int64_t kv_dims[4] = {query.dims[0], k->kv_num_heads, present_len, D};
  const int64_t cache_dims[4] = {query.dims[0], k->kv_num_heads, present_len, row};
  const int64_t kv_rows = kv_dims[0] * kv_dims[1] * kv_dims[2], kv_count = kv_rows * D;
  OrtValue* outputs[N_OUTPUTS] = {0};
  TRY(API(KernelContext_GetOutput)(context, 0, out_dims, 3, &outputs[0]));
  int64_t past_rows[2] = {0, 0}, past_dims[2][4];
  for (int i = 0; i < 2; ++i) {
    if (inputs[3 + i] == NULL) continue;
    past_rows[i] = past[i].dims[0] * past[i].dims[1] * past[i].dims[2];
    memcpy(past_dims[i], past[i].dims, sizeof past_dims[i]);
    past_dims[i][3] = D;
  }
  /* float32 scratch: the past key and value, then the present key and value */
  float* scratch = (float*)malloc((size_t)((past_rows[0] + past_rows[1]) * D + 2 * kv_count + 1) * sizeof(float));
  if (scratch == NULL) return API(CreateStatus)(ORT_FAIL, "GroupQueryAttention: out of memory");
  float* past32[2] = {scratch, scratch + past_rows[0] * D};
  float* present32[2] = {past32[1] + past_rows[1] * D, past32[1] + past_rows[1] * D + kv_count};
  OrtMemoryInfo* cpu = NULL;
  OrtValue* made[4] = {0};
  const OrtValue* fp32_inputs[N_INPUTS];
  memcpy(fp32_inputs, inputs, sizeof fp32_inputs);
  OrtStatus* status = API(CreateCpuMemoryInfo)(0 /* device allocator */, 0 /* default memory */, &cpu);
  for (int i = 0; i < 2 && status == NULL; ++i) {
    if (inputs[3 + i] == NULL) continue;
    cache_rows_to_floats(k->kind, past[i].data, past_rows[i], D, past32[i]);
    status = API(CreateTensorWithDataAsOrtValue)(cpu, past32[i], (size_t)(past_rows[i] * D) * sizeof(float),
                                                 past_dims[i], 4, ELEM_FLOAT, &made[i]);
    fp32_inputs[3 + i] = made[i];
  }
  for (int i = 0; i < 2 && status == NULL; ++i) {
    status = API(CreateTensorWithDataAsOrtValue)(cpu, present32[i], (size_t)kv_count * sizeof(float), kv_dims, 4,
                                                 ELEM_FLOAT, &made[2 + i]);
    outputs[1 + i] = made[2 + i];
  }
  if (status == NULL) status = API(InvokeOp)(context, k->fallback, fp32_inputs, N_INPUTS, outputs, N_OUTPUTS);
  for (int i = 0; i < 2 && status == NULL; ++i) {
    OrtValue* present = NULL;
    void* bits = NULL;
    status = API(KernelContext_GetOutput)(context, 1 + (size_t)i, cache_dims, 4, &present);
    if (status == NULL) status = API(GetTensorMutableData)(present, &bits);
    if (status != NULL) break;
    floats_to_cache_rows(k->kind, present32[i], kv_rows, D, bits);
  }
  for (int i = 0; i < 4; ++i)
    if (made[i] != NULL) API(ReleaseValue)(made[i]);
  if (cpu != NULL) API(ReleaseMemoryInfo)(cpu);
  free(scratch);
  return status;
}

/* Row tasks when there are enough of them for the threads, or the chunk tasks' partials
   would take more than this many floats. Either way a row gets the same bits. */
#define MAX_PARTIAL_FLOATS (4 << 20)

static OrtStatus* ORT_CALL kernel_compute(void* p, OrtKernelContext* context) {
  const Kernel* k = (const Kernel*)p;
  size_t n_inputs = 0;
  TRY(API(KernelContext_GetInputCount)(context, &n_inputs));
  if (n_inputs > N_INPUTS) n_inputs = N_INPUTS;
  const OrtValue* inputs[N_INPUTS] = {0};
  for (size_t i = 0; i < n_inputs; ++i) TRY(API(KernelContext_GetInput)(context, i, &inputs[i]));

  Tensor query, past_key, past_value, seqlens;
  const int cache_elem = k->kind == KV_F16   ? ELEM_FLOAT16
                         : k->kind == KV_I8  ? ELEM_INT8
                         : k->kind == KV_I16 ? ELEM_INT16
                                             : ELEM_FLOAT;
  /* a row's scale after its values: an int8 row's two bytes, an int16 row's one int16 */
  const int64_t extra = k->kind == KV_I8 ? I8_ROW(0) : k->kind == KV_I16 ? I16_ROW(0) : 0;
  int fast = inputs[0] != NULL && inputs[3] != NULL && inputs[4] != NULL && inputs[5] != NULL &&
             k->softcap == 0.0f && k->smooth_softmax == 0 &&
             k->num_heads > 0;
  if (k->do_rotary) fast = fast && n_inputs > 8 && inputs[7] != NULL && inputs[8] != NULL;
  if (fast) {
    TRY(describe(inputs[0], &query));
    TRY(describe(inputs[3], &past_key));
    TRY(describe(inputs[4], &past_value));
    TRY(describe(inputs[5], &seqlens));
    /* One new token per row (a decode step), or several in one row (a prefill chunk, a
       speculative check): several rows of several tokens mean padding to ONNX Runtime. */
    fast = query.rank == 3 && query.dims[1] >= 1 && (query.dims[1] == 1 || query.dims[0] == 1) &&
           query.elem == ELEM_FLOAT && past_key.rank == 4 && past_key.elem == cache_elem &&
           past_value.elem == cache_elem && past_value.rank == 4 && seqlens.rank == 1 &&
           seqlens.dims[0] == query.dims[0] && past_key.dims[0] == query.dims[0] &&
           past_key.dims[1] == k->kv_num_heads && past_key.dims[3] > extra && past_key.dims[3] - extra <= MAX_HEAD &&
           memcmp(past_key.dims, past_value.dims, sizeof past_key.dims) == 0;
  }
  OrtValue* outputs[N_OUTPUTS] = {0};
  if (fast) fast = k->num_heads / k->kv_num_heads <= MAX_VECTORS;
  /* an int16 cache's query limit (i16_limit) fits int16 from a head of 2 */
  if (fast && k->kind == KV_I16) fast = past_key.dims[3] - extra >= 2;
  if (!fast) return k->kind ? run_fallback_cast(k, context, inputs) : run_fallback(k, context, inputs);
  const int64_t B = query.dims[0], S = query.dims[1], H = k->num_heads, KVH = k->kv_num_heads;
  const int64_t D = past_key.dims[3] - extra, R = B * S;
  const int64_t cap = past_key.dims[2];
  const int packed = inputs[1] == NULL;
  const int64_t width = packed ? (H + 2 * KVH) * D : H * D;
  int shapes_ok = query.dims[2] == width;
  Tensor key = {0}, value = {0}, cos_cache = {0}, sin_cache = {0};
  if (!packed) {
    shapes_ok = shapes_ok && inputs[2] != NULL;
    if (shapes_ok) {
      TRY(describe(inputs[1], &key));
      TRY(describe(inputs[2], &value));
      shapes_ok = key.elem == ELEM_FLOAT && value.elem == ELEM_FLOAT && key.rank == 3 && value.rank == 3 &&
                  key.dims[0] == B && value.dims[0] == B && key.dims[1] == S && value.dims[1] == S &&
                  key.dims[2] == KVH * D && value.dims[2] == KVH * D;
    }
  }
  if (k->do_rotary && shapes_ok) {
    TRY(describe(inputs[7], &cos_cache));
    TRY(describe(inputs[8], &sin_cache));
    shapes_ok = cos_cache.rank == 2 && cos_cache.elem == ELEM_FLOAT && sin_cache.elem == ELEM_FLOAT &&
                cos_cache.dims[1] * 2 <= D && memcmp(cos_cache.dims, sin_cache.dims, 2 * sizeof(int64_t)) == 0;
  }
  /* seqlens_k: each row's total length - 1; the S new tokens follow its past. */
  const int32_t* lengths = (const int32_t*)seqlens.data;
  for (int64_t b = 0; b < B && shapes_ok; ++b)
    shapes_ok = lengths[b] + 1 >= S && lengths[b] < cap && (!k->do_rotary || lengths[b] < cos_cache.dims[0]);

  /* The outputs: the present caches must be the past ones (shared buffers). */
  const int64_t out_dims[3] = {B, S, H * D};
  if (shapes_ok) {
    TRY(API(KernelContext_GetOutput)(context, 0, out_dims, 3, &outputs[0]));
    TRY(API(KernelContext_GetOutput)(context, 1, past_key.dims, 4, &outputs[1]));
    TRY(API(KernelContext_GetOutput)(context, 2, past_value.dims, 4, &outputs[2]));
  }
  float* out = NULL;
  void *present_k = NULL, *present_v = NULL;
  if (shapes_ok) {
    TRY(API(GetTensorMutableData)(outputs[0], (void**)&out));
    TRY(API(GetTensorMutableData)(outputs[1], &present_k));
    TRY(API(GetTensorMutableData)(outputs[2], &present_v));
  }
  if (!shapes_ok || present_k != (void*)past_key.data || present_v != (void*)past_value.data)
    /* same shapes asked again: the same outputs */
    return k->kind ? run_fallback_cast(k, context, inputs) : run_fallback(k, context, inputs);

  const int64_t G = H / KVH;
  const float scale = k->scale != 0.0f ? k->scale : 1.0f / sqrtf((float)D);
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) longest = lengths[b] + 1 > longest ? lengths[b] + 1 : longest;
  const int64_t chunks = (longest + CHUNK - 1) / CHUNK;
  const int64_t block = row_block(G, R, KVH);
  const int row_tasks = enough_row_tasks(R, block, KVH) || R * H * chunks * (D + 2) > MAX_PARTIAL_FLOATS;
  float* q = (float*)malloc((size_t)(R * H * D) * sizeof(float));
  int32_t* totals = (int32_t*)malloc((size_t)R * sizeof(int32_t));
  float* partial = row_tasks ? NULL : (float*)malloc((size_t)(R * H * chunks * (D + 2)) * sizeof(float));
  if (q == NULL || totals == NULL || (!row_tasks && partial == NULL)) {
    free(q);
    free(totals);
    free(partial);
    return API(CreateStatus)(ORT_FAIL, "GroupQueryAttention: out of memory");
  }
  const int64_t half = cos_cache.dims[1];
  /* Every new key and value goes into the cache first: a row attends to those before it. */
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = r / S, pos = lengths[b] + 1 - S + r % S;
    totals[r] = (int32_t)(pos + 1);
    const float* row = query.data + r * width;
    const float* kin = packed ? row + H * D : key.data + r * KVH * D;
    const float* vin = packed ? row + (H + KVH) * D : value.data + r * KVH * D;
    const float* c = k->do_rotary ? cos_cache.data + pos * half : NULL;
    const float* s = k->do_rotary ? sin_cache.data + pos * half : NULL;
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q + (r * H + h) * D;
      memcpy(qh, row + h * D, (size_t)D * sizeof(float));
      if (k->do_rotary) rotate(qh, c, s, 2 * half, (int)k->rotary_interleaved);
      for (int64_t d = 0; d < D; ++d) qh[d] *= scale;
    }
    for (int64_t g = 0; g < KVH; ++g) {
      const int64_t row_at = (b * KVH + g) * cap + pos, at = row_at * D;
      if (k->kind != KV_F32) { /* rotated in float32, then rounded or quantized */
        float kd[MAX_HEAD];
        memcpy(kd, kin + g * D, (size_t)D * sizeof(float));
        if (k->do_rotary) rotate(kd, c, s, 2 * half, (int)k->rotary_interleaved);
        floats_to_cache_rows(k->kind, kd, 1, D, cache_row(k->kind, present_k, row_at, D));
        floats_to_cache_rows(k->kind, vin + g * D, 1, D, cache_row(k->kind, present_v, row_at, D));
        continue;
      }
      float* kd = (float*)present_k + at;
      memcpy(kd, kin + g * D, (size_t)D * sizeof(float));
      if (k->do_rotary) rotate(kd, c, s, 2 * half, (int)k->rotary_interleaved);
      memcpy((float*)present_v + at, vin + g * D, (size_t)D * sizeof(float));
    }
  }
  Step step = {R, H, KVH, G, D, cap, chunks, S, totals, q, present_k, present_v, partial, out, 0, k->kind,
               k->local_window_size, block};
  OrtStatus* status;
  if (row_tasks) {
    const int64_t blocks = (R + block - 1) / block;
    status = engine_parallel(context, attend_rows, (size_t)(blocks * KVH), &step, 0);
    if (status == NULL && step.failed) status = API(CreateStatus)(ORT_FAIL, "GroupQueryAttention: out of memory");
  } else {
    status = engine_parallel(context, attend_chunk, (size_t)(R * KVH * chunks), &step, R <= 8);
    if (status == NULL && step.failed) status = API(CreateStatus)(ORT_FAIL, "GroupQueryAttention: out of memory");
    if (status == NULL)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t h = 0; h < H; ++h)
          combine(partial + (r * H + h) * chunks * (D + 2), chunks, D, out + (r * H + h) * D);
  }
  free(q);
  free(totals);
  free(partial);
  return status;
}

const OrtFn* g_api;
static OrtCustomOpDomain* g_domain;

/* ---- how many threads the kernels' loops use ---------------------------------------- */

/* 0: the session's (ParallelFor); n >= 1: at most n (EngineKernelsSetThreads). */
static volatile int g_thread_cap;

typedef struct Parts {
  void (*fn)(void*, size_t);
  void* data;
  size_t total, parts;
} Parts;

/* Part i of `parts`: tasks [i * total / parts, (i + 1) * total / parts), in order. */
static void run_part(void* p, size_t i) {
  const Parts* parts = (const Parts*)p;
  const size_t from = i * parts->total / parts->parts, to = (i + 1) * parts->total / parts->parts;
  for (size_t task = from; task < to; ++task) parts->fn(parts->data, task);
}

OrtStatus* engine_parallel(const OrtKernelContext* context, void (*fn)(void*, size_t), size_t total, void* data,
                           int brief) {
  const int cap = brief ? g_thread_cap : 0;
  if (cap <= 0 || total <= 1) return API(KernelContext_ParallelFor)(context, fn, total, 0, data);
  if (cap == 1) {
    for (size_t task = 0; task < total; ++task) fn(data, task);
    return NULL;
  }
  /* at most `cap` tasks at a time: `cap` parts of consecutive tasks */
  Parts parts = {fn, data, total, (size_t)cap < total ? (size_t)cap : total};
  return API(KernelContext_ParallelFor)(context, run_part, parts.parts, 0, &parts);
}

/* For the engine (ctypes): cap the threads the kernels' loops use at n (0: the session's
   own, the default). Takes effect at the next operator run; every result stays the same. */
ENGINE_EXPORT void EngineKernelsSetThreads(int n) { g_thread_cap = n > 0 ? n : 0; }

/* How many runs of the attention operators went to ONNX Runtime's kernel so far. */
ENGINE_EXPORT long EngineKernelsFallbacks(void) { return __atomic_load_n(&g_fallbacks, __ATOMIC_RELAXED); }

/* The cap EngineKernelsSetThreads set (0: none). */
ENGINE_EXPORT int EngineKernelsThreads(void) { return g_thread_cap; }

/* Which dot products the kernel runs on this CPU, and why: what RegisterCustomOps picks. */
static const char* choose_paths(void) {
#ifdef HAVE_X86_PATHS
  __builtin_cpu_init();
  const char* choice = getenv("ONNX_GENAI_KERNELS");
  if (choice != NULL && strcmp(choice, "portable") == 0) return "portable: ONNX_GENAI_KERNELS=portable";
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return "portable: this CPU lacks AVX2 or FMA";
  if (choice != NULL && strcmp(choice, "avx2") == 0) return "avx2+fma: AVX-512 left out (ONNX_GENAI_KERNELS=avx2)";
  if (!__builtin_cpu_supports("avx512f")) return "avx2+fma";
#ifdef HAVE_AMX
  if (choice != NULL && strcmp(choice, "avx512") == 0) return "avx2+fma: and AVX-512 (AMX left out: ONNX_GENAI_KERNELS=avx512)";
  if (amx_available()) return "avx2+fma: and AVX-512, AMX-BF16 for int8 and float16 KV";
#endif
  return "avx2+fma: and AVX-512";
#else
  return "portable: built without the x86-64 AVX2 code";
#endif
}

/* Where an int16 cache's attention runs on VPDPWSSD with these paths: 1 on 512-bit
   registers (AVX-512 chosen, not left out by ONNX_GENAI_KERNELS, on a CPU with AVX-512 BW,
   VL and VNNI), 2 on 256-bit ones (AVX2 chosen on a CPU with AVX-VNNI: Intel's client cores,
   or AVX-512 left out), 0 nowhere (plain C). */
static int vnni_rows(const char* paths) {
#ifdef HAVE_X86_PATHS
  if (strncmp(paths, "avx2+fma: and AVX-512", 21) == 0 && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
    return 1;
#ifdef HAVE_AVX_VNNI
  if (strncmp(paths, "avx2+fma", 8) == 0 && avx_vnni_cpu()) return 2;
#endif
  return 0;
#else
  (void)paths;
  return 0;
#endif
}

/* For the engine (ctypes): 1 where an int16 cache's attention runs on AVX-512 VNNI here,
   2 where on AVX-VNNI's 256-bit registers, 0 where it runs in plain C (the same numbers, slower: the engine then keeps float16 KV
   unless int16 is asked for). A build without this function has no int16 cache. */
ENGINE_EXPORT int EngineKernelsInt16Fast(void) { return vnni_rows(choose_paths()); }

/* For `python -m engine.kernels` (ctypes): the paths this library runs, "avx2+fma" or
   "portable: <why>". A build without this function predates it. */
ENGINE_EXPORT const char* EngineKernelsPaths(void) { return choose_paths(); }

/* The same for the 4-bit matmul (matmul_nbits.c): "avx512-vnni", "avx2: <why>" or
   "portable: <why>". */
ENGINE_EXPORT const char* EngineKernelsMatmulPaths(void) { return engine_matmul_paths(); }

/* Called by ONNX Runtime (SessionOptions.register_custom_ops_library). */
ENGINE_EXPORT OrtStatus* ORT_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  if (g_api == NULL) {
    const char* paths = choose_paths();
    g_isa = strncmp(paths, "avx2+fma", 8) != 0 ? 0 : strncmp(paths, "avx2+fma: and AVX-512", 21) == 0 ? 2 : 1;
#ifdef HAVE_AMX
    g_amx = strstr(paths, "AMX-BF16") != NULL;
#endif
#ifdef HAVE_X86_PATHS
    g_vnni = vnni_rows(paths);
    g_half = g_isa == 2 ? 2 : g_isa == 1 && __builtin_cpu_supports("f16c") ? 1 : 0;
#endif
    g_api = base->GetApi(API_VERSION);
    if (g_api == NULL) return NULL; /* cannot even report: ONNX Runtime older than 1.20 */
  }
  g_op.version = OP_VERSION;
  g_op.CreateKernel = NULL;
  g_op.GetName = op_name;
  g_op.GetExecutionProviderType = op_provider;
  g_op.GetInputType = input_type;
  g_op.GetInputTypeCount = input_count;
  g_op.GetOutputType = output_type;
  g_op.GetOutputTypeCount = output_count;
  g_op.KernelCompute = kernel_compute_v1;
  g_op.KernelDestroy = kernel_destroy;
  g_op.GetInputCharacteristic = input_characteristic;
  g_op.GetOutputCharacteristic = output_characteristic;
  g_op.GetInputMemoryType = input_memory_type;
  g_op.GetVariadicInputMinArity = variadic_arity;
  g_op.GetVariadicInputHomogeneity = variadic_homogeneity;
  g_op.GetVariadicOutputMinArity = variadic_arity;
  g_op.GetVariadicOutputHomogeneity = variadic_homogeneity;
  g_op.CreateKernelV2 = kernel_create;
  g_op.KernelComputeV2 = kernel_compute;
  g_op_f16 = g_op; /* the same functions: they tell them apart by the table's address */
  g_op_i8 = g_op;
  g_op_i16 = g_op;
  if (g_domain == NULL) TRY(API(CreateCustomOpDomain)("engine.kernels", &g_domain));
  static int added = 0;
  if (!added) {
    TRY(API(CustomOpDomain_Add)(g_domain, &g_op));
    TRY(API(CustomOpDomain_Add)(g_domain, &g_op_f16));
    TRY(API(CustomOpDomain_Add)(g_domain, &g_op_i8));
    TRY(API(CustomOpDomain_Add)(g_domain, &g_op_i16));
    TRY(engine_matmul_register(g_domain));
    added = 1;
  }
  return API(AddCustomOpDomain)(options, g_domain);
}
