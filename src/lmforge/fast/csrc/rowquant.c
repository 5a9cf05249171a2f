/* Per-row activation quantisation for lmforge's int8 products (fast/native.py builds this file,
   fast/engines.py calls it).

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
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float ROUND = 12582912.0f; /* 1.5 * 2^23 */

static void quantise_row(const float *x, long cols, float levels, int zp, uint8_t *q, float *peak) {
    uint32_t top = 0;
    for (long c = 0; c < cols; c++) {
        uint32_t bits;
        memcpy(&bits, x + c, 4);
        bits &= 0x7fffffffu;
        top = bits > top ? bits : top;
    }
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

/* q (rows, cols) and peak (rows,) from x (rows, cols), x * inv per column where inv is not NULL;
   levels <= 127 and zp in [levels, 255 - levels]. threads: at most this many (torch's count). */
void quantise_rows(const float *x, long rows, long cols, const float *inv, float levels, int zp,
                   uint8_t *q, float *peak, int threads) {
    if (threads < 1 || rows * cols < 65536) threads = 1; /* small calls: waking a thread costs more */
    #pragma omp parallel num_threads(threads)
    {
        int n = omp_get_num_threads(), t = omp_get_thread_num();
        long per = (rows + n - 1) / n, first = t * per, last = first + per < rows ? first + per : rows;
        float *scaled = inv != NULL && first < last ? malloc(sizeof(float) * (size_t)cols) : NULL;
        for (long r = first; r < last; r++) {
            const float *row = x + r * cols;
            if (scaled != NULL) {
                for (long c = 0; c < cols; c++) scaled[c] = row[c] * inv[c];
                row = scaled;
            } else if (inv != NULL) { /* no memory for the scaled row: its values are marked unusable */
                float nan;
                uint32_t bits = 0x7fc00000u;
                memcpy(&nan, &bits, 4);
                memset(q + r * cols, zp, (size_t)cols);
                peak[r] = nan;
                continue;
            }
            quantise_row(row, cols, levels, zp, q + r * cols, peak + r);
        }
        free(scaled);
    }
}
