/* Per-row activation quantisation for lmforge's int8 products (quant/native.py builds this file,
   quant/engines.py calls it), and the same for a feed-forward layer's hidden units as they are made.

   Each row of x (rows, cols) is mapped onto the integers [zp - levels, zp + levels] by its own largest
   |value| (its peak): q = round(x * levels / peak) + zp, as unsigned bytes, and the peak is returned
   so that the product's output row can be multiplied back by it. In torch this takes four passes over
   x (two reductions, a division into a buffer, the engine's own range scan and rounding); here it is
   one read of each row (it stays in cache between its two loops) and a write of a quarter of its
   bytes. Where the layer was smoothed (SmoothQuant), x is multiplied by inv = 1 / s first.

   Written so that gcc vectorises every loop without -ffast-math: the peak is an integer max over
   the values' bit patterns with the sign cleared (ordered as the floats, with inf and NaN above every
   finite value, so a non-finite row is seen); rounding is (v + 1.5 * 2^23) - 1.5 * 2^23, round half to
   even for |v| < 2^22. A row holding NaN or inf is written as zp with its peak non-finite: its output
   row is NaN, never a finite number made up from it.

   Rows are split over OpenMP threads. The library is linked against libgomp.so.1, the OpenMP runtime
   torch itself loaded, so it runs on torch's thread pool (threads from another pool would compete for
   the cores torch's threads spin on: measured 1.4 ms a call instead of 0.2). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float ROUND = 12582912.0f; /* 1.5 * 2^23 */

static int team(long rows, long cols, int threads) { /* small calls: waking a thread costs more */
    return threads < 1 || rows * cols < 65536 ? 1 : threads;
}

static void my_rows(long rows, long *first, long *last) { /* this OpenMP thread's share of the rows */
    int n = omp_get_num_threads(), t = omp_get_thread_num();
    long per = (rows + n - 1) / n;
    *first = t * per;
    *last = *first + per < rows ? *first + per : rows;
}

static void unusable_row(uint8_t *q, long cols, int zp, float *peak) { /* no memory to work in: NaN */
    float nan;
    uint32_t bits = 0x7fc00000u;
    memcpy(&nan, &bits, 4);
    memset(q, zp, (size_t)cols);
    *peak = nan;
}

/* x's row quantised by its peak, found before: top, the largest |value|'s bit pattern (sign cleared) */
static void quantise_found(const float *x, long cols, uint32_t top, float levels, int zp, uint8_t *q,
                           float *peak) {
    float high;
    memcpy(&high, &top, 4);
    if (top >= 0x7f800000u) { /* inf or NaN in the row */
        memset(q, zp, (size_t)cols);
        *peak = high;
        return;
    }
    high = high < 1e-30f ? 1e-30f : high;
    *peak = high;
    float scale = levels / high, offset = (float)zp;
    for (long c = 0; c < cols; c++) q[c] = (uint8_t)(int32_t)(((x[c] * scale + ROUND) - ROUND) + offset);
}

static void quantise_row(const float *x, long cols, float levels, int zp, uint8_t *q, float *peak) {
    uint32_t top = 0;
    for (long c = 0; c < cols; c++) {
        uint32_t bits;
        memcpy(&bits, x + c, 4);
        bits &= 0x7fffffffu;
        top = bits > top ? bits : top;
    }
    quantise_found(x, cols, top, levels, zp, q, peak);
}

/* q (rows, cols) and peak (rows,) from x (rows, cols), x * inv per column where inv is not NULL;
   levels <= 127 and zp in [levels, 255 - levels]. threads: at most this many (torch's count). */
void quantise_rows(const float *x, long rows, long cols, const float *inv, float levels, int zp,
                   uint8_t *q, float *peak, int threads) {
    #pragma omp parallel num_threads(team(rows, cols, threads))
    {
        long first, last;
        my_rows(rows, &first, &last);
        float *scaled = inv != NULL && first < last ? malloc(sizeof(float) * (size_t)cols) : NULL;
        for (long r = first; r < last; r++) {
            const float *row = x + r * cols;
            if (scaled != NULL) {
                for (long c = 0; c < cols; c++) scaled[c] = row[c] * inv[c];
                row = scaled;
            } else if (inv != NULL) { /* no memory for the scaled row: its values are marked unusable */
                unusable_row(q + r * cols, cols, zp, peak + r);
                continue;
            }
            quantise_row(row, cols, levels, zp, q + r * cols, peak + r);
        }
        free(scaled);
    }
}

/* The hidden units of a feed-forward layer whose up and down projections both run "onednn-u8"
   (quant/int8_ffn.py), made and quantised for the down projection in one pass: row r of the up
   product acc (rows, cols) (its input row was scaled by 1 / rowscale[r]) becomes
   h = act(acc * rowscale[r] + bias) (* inv, the down projection's 1 / s where it was smoothed) in a
   row buffer that stays in cache, and is quantised from there as quantise_rows does. Unfused, the same
   takes an addcmul, torch's GELU and quantise_rows: three passes over the (rows, d_ff) fp32 tensor.
   act: 0 none, 1 ReLU, 2 GELU (erf form).

   GELU(v) = v (1 + erf(v / sqrt 2)) / 2, erf by a rational function (below) whose error is at most
   4e-7, so GELU's is at most 2e-7 |v|: far below the 7- or 8-bit step (peak / 63 or / 127) the value
   is rounded to next, though a value within that of a rounding boundary can round the other way
   (a few in millions, one step). A NaN stays NaN (the result multiplies v); ReLU keeps NaN too
   (v < 0 is false for it). */
#ifdef __FMA__ /* a * b + c in one rounding where the machine has it (a vector instruction), else two */
#define MADD(a, b, c) fmaf(a, b, c)
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

/* erf(u) = u P(u^2) / Q(u^2) on |u| <= 3.92 (erf is 1 in fp32 beyond), P and Q of degree 5, fitted by
   least squares reweighted towards the largest error (bench/erf_fit.py): 1e-7 in float64, 4e-7
   evaluated in fp32. One division and ten multiply-adds: torch's GELU costs ~2.5x more here. */
static const float ERF_P[6] = {1.128379147f, 0.1833096885f, 0.05195815246f, 0.003502291527f,
                               0.0002861154322f, 2.198366982e-06f};
static const float ERF_Q[6] = {1.0f, 0.4957870001f, 0.1113104662f, 0.01443537377f, 0.00111206051f,
                               3.969253535e-05f};

static inline float gelu(float v) {
    float u = v * 0.70710678f, a = fabsf(u);
    a = a < 3.92f ? a : 3.92f; /* NaN -> 3.92: v carries the NaN into the result */
    float s = a * a; /* Horner's rule written out: a loop here keeps gcc from vectorising the caller's */
    float p = MADD(MADD(MADD(MADD(MADD(ERF_P[5], s, ERF_P[4]), s, ERF_P[3]), s, ERF_P[2]), s, ERF_P[1]), s,
                   ERF_P[0]);
    float q = MADD(MADD(MADD(MADD(MADD(ERF_Q[5], s, ERF_Q[4]), s, ERF_Q[3]), s, ERF_Q[2]), s, ERF_Q[1]), s,
                   ERF_Q[0]);
    float e = a * p / q; /* erf(|u|) */
    e = e < 1.0f ? e : 1.0f;
    e = u < 0.0f ? -e : e;
    return MADD(0.5f * v, e, 0.5f * v);
}

/* One loop per case (activation; bias or none), so that gcc vectorises each: a test inside the loop on a
   pointer that may be NULL kept it from vectorising the loop at all (6x slower). Unsmoothed layers
   multiply by ones (exact: v * 1 is v, NaN and inf included): without the multiplication gcc left the
   ReLU loop scalar (9x slower) and the GELU one slower */
#define ROW_LOOP(VALUE)                                                                                   \
    for (long c = 0; c < cols; c++) {                                                                 \
        float v = a[c] * s;                                                                           \
        v = (VALUE) * inv[c];                                                                         \
        h[c] = v;                                                                                     \
        uint32_t bits;                                                                                \
        memcpy(&bits, &v, 4);                                                                         \
        bits &= 0x7fffffffu;                                                                          \
        top = bits > top ? bits : top;                                                                \
    }
#define ACT_LOOPS(BIASED)                                                                                 \
    if (act == 2) {                                                                                   \
        ROW_LOOP(gelu(BIASED))                                                                        \
    } else if (act == 1) {                                                                            \
        ROW_LOOP(BIASED < 0.0f ? 0.0f : BIASED) /* NaN stays NaN */                                   \
    } else {                                                                                          \
        ROW_LOOP(BIASED)                                                                              \
    }

/* h = act(a * s + bias) * inv, one row of cols; returns its peak's bit pattern (quantise_row's rule),
   found as the values are made: one loop over the row, not four */
static uint32_t make_row(const float *a, float s, const float *bias, int act, const float *inv, float *h,
                         long cols) {
    uint32_t top = 0;
    if (bias != NULL) {
        ACT_LOOPS(v + bias[c])
    } else {
        ACT_LOOPS(v)
    }
    return top;
}
#undef ACT_LOOPS
#undef ROW_LOOP

void act_quantise_rows(const float *acc, long rows, long cols, const float *rowscale, const float *bias,
                       int act, const float *inv, float levels, int zp, uint8_t *q, float *peak,
                       int threads) {
    #pragma omp parallel num_threads(team(rows, cols, threads))
    {
        long first, last;
        my_rows(rows, &first, &last);
        /* the row buffer, and ones to multiply an unsmoothed layer's values by (make_row) */
        float *h = first < last ? malloc(sizeof(float) * (size_t)cols * (inv == NULL ? 2 : 1)) : NULL;
        const float *by = inv;
        if (h != NULL && inv == NULL) {
            for (long c = 0; c < cols; c++) h[cols + c] = 1.0f;
            by = h + cols;
        }
        for (long r = first; r < last; r++) {
            if (h == NULL) { /* no memory for the row: its values are marked unusable */
                unusable_row(q + r * cols, cols, zp, peak + r);
                continue;
            }
            uint32_t top = make_row(acc + r * cols, rowscale[r], bias, act, by, h, cols);
            quantise_found(h, cols, top, levels, zp, q + r * cols, peak + r);
        }
        free(h);
    }
}
