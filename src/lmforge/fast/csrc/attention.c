/* Bidirectional attention for inference on the CPU at small head sizes (fast/native_attention.py
   calls it; quant/native.py's `load` builds it into a library of its own):
   out = softmax(q k^T * scale + key_bias) v, sequence by sequence and head by head, no mask.

   Why: at the sizes of sentence encoders (T <= 128, dh = 32 or 64) SDPA's CPU kernel runs at under
   half the products' rate, and a second thread gives it 1.6-1.7x (bench/FINDINGS.md): it blocks for
   long sequences and calls a general GEMM per block. Here one (sequence, head) is one task: its keys
   transposed and its values copied side by side into small buffers, eight queries at a time scored
   against every key in registers (4 queries x up to 4 key vectors; 3 on AVX2), the eight rows'
   softmax, and their outputs summed over the values (8 queries, 4 on AVX2, x 2 value vectors), all in
   L1. One OpenMP region a call (torch's pool, `threads` threads) serves every sequence of the batch,
   packed rows of different lengths included: no padding and no mask.

   Layout: rows addressed as base + row * row_stride + head * head_stride + i (the fused projection's
   views, as split in layers/attention.py), a sequence's rows consecutive from starts[s]. key_bias:
   NULL or an additive bias per key, key_bias[s * bias_stride + j]. Queries are scaled before the
   product; exp is a polynomial (relative error ~2e-7). NaN in q, k or v stays NaN in the output. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define VLEN 16
#define QK_VECS 4 /* key vectors a score block holds: 4 queries x 4 = 16 accumulators */
#define PV_ROWS 8 /* queries an output block holds: 8 x 2 value vectors = 16 accumulators */
typedef __m512 vec;
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vfma _mm512_fmadd_ps
#define vmax _mm512_max_ps
#define vmin _mm512_min_ps
#define vround(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vpow2(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), \
                                                                       _mm512_set1_epi32(127)), 23))
#define vhmax _mm512_reduce_max_ps
#define vhsum _mm512_reduce_add_ps
#define HAVE_VECTORS 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VLEN 8
#define QK_VECS 3 /* 4 x 3 = 12 accumulators of 16 registers */
#define PV_ROWS 4 /* 4 x 2 = 8 */
typedef __m256 vec;
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vfma _mm256_fmadd_ps
#define vmax _mm256_max_ps
#define vmin _mm256_min_ps
#define vround(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vpow2(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), \
                                                                       _mm256_set1_epi32(127)), 23))
static inline float vhmax(__m256 x) {
    float t[8], m;
    _mm256_storeu_ps(t, x);
    m = t[0];
    for (int i = 1; i < 8; i++) m = t[i] > m || t[i] != t[i] ? t[i] : m;
    return m;
}
static inline float vhsum(__m256 x) {
    float t[8], s = 0.0f;
    _mm256_storeu_ps(t, x);
    for (int i = 0; i < 8; i++) s += t[i];
    return s;
}
#define HAVE_VECTORS 1
#endif

#define Q_ROWS 8 /* queries a block scores, normalises and sums together */
#define INLINE static inline __attribute__((always_inline))

/* Whether this build has the kernel (vector code for AVX2 + FMA or AVX-512), and its vector width */
int attention_vector_width(void) {
#ifdef HAVE_VECTORS
    return VLEN;
#else
    return 0;
#endif
}

#ifdef HAVE_VECTORS

/* exp(x) for x <= 0 (scores less their row's maximum): 2^n 2^f with n = round(x log2 e), |f| <= 1/2,
   2^f by its degree-6 Taylor polynomial (relative error ~2e-7, plus x's rounding times log2 e: at most
   ~1e-5 where exp(x) < 1e-37, a share of a row's sum nothing can see). Far below that: AVX-512's
   scalef gives denormals down to x ~ -103, then 0; the AVX2 form stops at 2^-126 (~1e-38, x < -87.3).
   -inf (a padded key's score) gives the same, never NaN */
#if VLEN == 16
INLINE vec vexp(vec x) {
    vec t = vmul(vmax(vset1(-126.0f), x), vset1(1.44269504088896341f)); /* this operand order keeps NaN */
    vec n = vround(t), f = vsub(t, n), p = vset1(1.5403530393381606e-4f);
    p = vfma(p, f, vset1(1.3333558146428443e-3f));
    p = vfma(p, f, vset1(9.6181291076284772e-3f));
    p = vfma(p, f, vset1(5.5504108664821580e-2f));
    p = vfma(p, f, vset1(2.4022650695910071e-1f));
    p = vfma(p, f, vset1(6.9314718055994531e-1f));
    p = vfma(p, f, vset1(1.0f));
    return _mm512_scalef_ps(p, n); /* p 2^n */
}
#else
INLINE vec vexp(vec x) {
    x = vmax(vset1(-87.33654f), x); /* this operand order keeps NaN */
    vec n = vround(vmul(x, vset1(1.44269504088896341f)));
    vec r = vsub(vsub(x, vmul(n, vset1(0.693359375f))), vmul(n, vset1(-2.12194440e-4f)));
    vec p = vset1(1.9875691500e-4f); /* Cephes' expf */
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
    /* the clamp keeps n >= -126, where 2^n is a normal float */
    return vmul(p, vpow2(vmax(n, vset1(-127.0f))));
}
#endif

/* s[r][c * VLEN ..] = q rows r (4 of them, dh long, already scaled) . keys (kt: dh x lk), for NV
   key vectors from column c0 */
INLINE void score_block(const float *q, int dh, const float *kt, long lk, long c0, float *s, const int NV) {
    vec acc[4][QK_VECS];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++) acc[r][c] = vzero();
    for (int i = 0; i < dh; i++) {
        vec key[QK_VECS];
        for (int c = 0; c < NV; c++) key[c] = vload(kt + i * lk + c0 + c * VLEN);
        for (int r = 0; r < 4; r++) {
            vec b = vset1(q[r * dh + i]);
            for (int c = 0; c < NV; c++) acc[r][c] = vfma(b, key[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++) vstore(s + r * lk + c0 + c * VLEN, acc[r][c]);
}

static void scores(const float *q, int dh, const float *kt, long lk, float *s) {
    for (int r = 0; r < Q_ROWS; r += 4) {
        long c0 = 0;
        for (; c0 + QK_VECS * VLEN <= lk; c0 += QK_VECS * VLEN)
            score_block(q + r * dh, dh, kt, lk, c0, s + r * lk, QK_VECS);
        switch ((lk - c0) / VLEN) { /* the last 0 .. QK_VECS - 1 vectors */
        case 1: score_block(q + r * dh, dh, kt, lk, c0, s + r * lk, 1); break;
        case 2: score_block(q + r * dh, dh, kt, lk, c0, s + r * lk, 2); break;
#if QK_VECS > 3
        case 3: score_block(q + r * dh, dh, kt, lk, c0, s + r * lk, 3); break;
#endif
        default: break;
        }
    }
}

/* Each row of s (Q_ROWS x lk, n real keys) -> exp(row - max), returning 1 / sum in inv */
static void softmax_rows(float *s, long lk, long n, const float *bias, float *inv) {
    for (int r = 0; r < Q_ROWS; r++) {
        float *row = s + r * lk;
        if (bias != NULL)
            for (long j = 0; j < n; j++) row[j] += bias[j];
        for (long j = n; j < lk; j++) row[j] = -INFINITY; /* the padding of the last vector */
        vec m = vload(row);
        for (long j = VLEN; j < lk; j += VLEN) m = vmax(vload(row + j), m);
        vec top = vset1(vhmax(m)), sum = vzero();
        for (long j = 0; j < lk; j += VLEN) {
            vec e = vexp(vsub(vload(row + j), top));
            vstore(row + j, e);
            sum = vadd(sum, e);
        }
        inv[r] = 1.0f / vhsum(sum);
    }
}

/* out rows (R of them) = p rows (lk apart) . v, for NV value vectors from column c0 */
INLINE void output_block(const float *p, long lk, long n, const float *v, long v_row, long c0, const float *inv,
                         float *out, long o_row, const int R, const int NV) {
    vec acc[PV_ROWS][2];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) acc[r][c] = vzero();
    for (long j = 0; j < n; j++) {
        vec val[2];
        for (int c = 0; c < NV; c++) val[c] = vload(v + j * v_row + c0 + c * VLEN);
        for (int r = 0; r < R; r++) {
            vec b = vset1(p[r * lk + j]);
            for (int c = 0; c < NV; c++) acc[r][c] = vfma(b, val[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) vstore(out + r * o_row + c0 + c * VLEN, vmul(acc[r][c], vset1(inv[r])));
}

static void outputs(const float *p, long lk, long n, const float *v, long v_row, int dh, const float *inv,
                    float *out, long o_row, int rows) {
    for (int r = 0; r < rows; r += PV_ROWS) {
        int left = rows - r;
        for (long c0 = 0; c0 < dh; c0 += 2 * VLEN) {
            int two = c0 + 2 * VLEN <= dh;
            const float *pr = p + r * lk;
            float *o = out + r * o_row;
            if (left >= PV_ROWS) {
                if (two) output_block(pr, lk, n, v, v_row, c0, inv + r, o, o_row, PV_ROWS, 2);
                else output_block(pr, lk, n, v, v_row, c0, inv + r, o, o_row, PV_ROWS, 1);
            } else
                for (int k = 0; k < left; k++) { /* the last rows of a sequence, one at a time */
                    if (two) output_block(pr + k * lk, lk, n, v, v_row, c0, inv + r + k, o + k * o_row, o_row, 1, 2);
                    else output_block(pr + k * lk, lk, n, v, v_row, c0, inv + r + k, o + k * o_row, o_row, 1, 1);
                }
        }
    }
}

typedef struct {
    const float *q, *k, *v;
    float *o;
    long q_row, q_head, k_row, k_head, v_row, v_head, o_row, o_head;
    const long *starts, *lengths;
    const float *key_bias;
    long bias_stride;
    int heads, kv_heads, dh;
    float scale;
} job;

/* Ask for the lines of n strided rows (the fused projection's) at once: a miss on each in turn, as the
   copies below read them, would cost more than the task's arithmetic */
static void prefetch_rows(const float *x, long row, long n, int dh) {
    for (long j = 0; j < n; j++)
        for (int i = 0; i < dh; i += 16) __builtin_prefetch(x + j * row + i);
}

/* dst (8 x 8, rows dst_row apart) = the transpose of src (8 x 8, rows src_row apart): the classic
   unpack / shuffle / lane-permute sequence (gcc would otherwise scatter, which costs a third of the
   kernel's time) */
static inline void transpose8(const float *src, long src_row, float *dst, long dst_row) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * src_row);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * dst_row, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * dst_row, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* kt (dh x lk) = the n keys (rows k_row apart) transposed, zero past n; vs (n x dh) = the values, rows
   side by side: the product loops then read consecutive memory, not a page a row */
static void gather_keys_values(const float *k, long k_row, const float *v, long v_row, long n, long lk, int dh,
                               float *kt, float *vs) {
    long j = 0;
    for (; j + 8 <= n; j += 8)
        for (int i = 0; i < dh; i += 8) transpose8(k + j * k_row + i, k_row, kt + (long)i * lk + j, lk);
    for (; j < n; j++)
        for (int i = 0; i < dh; i++) kt[(long)i * lk + j] = k[j * k_row + i];
    for (int i = 0; i < dh; i++)
        for (j = n; j < lk; j++) kt[(long)i * lk + j] = 0.0f;
    for (j = 0; j < n; j++) memcpy(vs + j * dh, v + j * v_row, dh * sizeof(float));
}

/* One (sequence, head): work holds kt (dh x lk), vs (lk x dh), qs (Q_ROWS x dh), s (Q_ROWS x lk), inv */
static void one_head(const job *a, long seq, int h, float *work, long max_lk) {
    long n = a->lengths[seq], first = a->starts[seq], lk = (n + VLEN - 1) / VLEN * VLEN;
    int dh = a->dh, g = h / (a->heads / a->kv_heads);
    float *kt = work, *vs = kt + (long)dh * max_lk, *qs = vs + (long)dh * max_lk, *s = qs + Q_ROWS * dh,
          *inv = s + Q_ROWS * max_lk;
    const float *bias = a->key_bias != NULL ? a->key_bias + seq * a->bias_stride : NULL;
    const float *q0 = a->q + first * a->q_row + h * a->q_head, *k = a->k + first * a->k_row + g * a->k_head,
                *v = a->v + first * a->v_row + g * a->v_head;
    prefetch_rows(q0, a->q_row, n, dh);
    prefetch_rows(k, a->k_row, n, dh);
    prefetch_rows(v, a->v_row, n, dh);
    gather_keys_values(k, a->k_row, v, a->v_row, n, lk, dh, kt, vs);
    for (long r0 = 0; r0 < n; r0 += Q_ROWS) {
        int rows = n - r0 < Q_ROWS ? (int)(n - r0) : Q_ROWS;
        const float *q = q0 + r0 * a->q_row;
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < dh; i++) qs[r * dh + i] = q[r * a->q_row + i] * a->scale;
        for (int r = rows; r < Q_ROWS; r++)
            for (int i = 0; i < dh; i++) qs[r * dh + i] = 0.0f;
        scores(qs, dh, kt, lk, s);
        softmax_rows(s, lk, n, bias, inv);
        outputs(s, lk, n, vs, dh, dh, inv, a->o + (first + r0) * a->o_row + h * a->o_head, a->o_row, rows);
    }
}

#endif

/* out = softmax(q k^T * scale + key_bias) v for each of n_seq sequences and `heads` heads (kv_heads
   key/value heads, each serving heads / kv_heads query heads); dh a multiple of the vector width.
   Returns 0, or -1 where this build has no kernel or the work space could not be allocated. */
int attend_rows(const float *q, long q_row, long q_head, const float *k, long k_row, long k_head,
                const float *v, long v_row, long v_head, float *o, long o_row, long o_head,
                const long *starts, const long *lengths, long n_seq, const float *key_bias, long bias_stride,
                int heads, int kv_heads, int dh, float scale, int threads) {
#ifdef HAVE_VECTORS
    job a = {q, k, v, o, q_row, q_head, k_row, k_head, v_row, v_head, o_row, o_head, starts, lengths,
             key_bias, bias_stride, heads, kv_heads, dh, scale};
    long max_lk = 0, tasks = n_seq * heads;
    for (long s = 0; s < n_seq; s++)
        if (lengths[s] > max_lk) max_lk = lengths[s];
    max_lk = (max_lk + VLEN - 1) / VLEN * VLEN;
    size_t bytes = ((size_t)2 * dh * max_lk + Q_ROWS * dh + Q_ROWS * max_lk + Q_ROWS) * sizeof(float);
    bytes = (bytes + 63) / 64 * 64;
    if (threads < 1 || tasks < 2) threads = 1;
    float *work = aligned_alloc(64, bytes * threads); /* one work space a thread, allocated once */
    if (work == NULL) return -1;
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long t = 0; t < tasks; t++)
        if (lengths[t / heads] > 0)
            one_head(&a, t / heads, (int)(t % heads), work + omp_get_thread_num() * (bytes / sizeof(float)), max_lk);
    free(work);
    return 0;
#else
    (void)q; (void)q_row; (void)q_head; (void)k; (void)k_row; (void)k_head; (void)v; (void)v_row;
    (void)v_head; (void)o; (void)o_row; (void)o_head; (void)starts; (void)lengths; (void)n_seq;
    (void)key_bias; (void)bias_stride; (void)heads; (void)kv_heads; (void)dh; (void)scale; (void)threads;
    return -1;
#endif
}
