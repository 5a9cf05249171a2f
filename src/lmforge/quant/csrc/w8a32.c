/* Weight-only int8 products at a few rows, for decoding (quant/native.py builds this file beside
   rowquant.c, quant/engines.py calls it): y = (x q^T) * scale + bias, q (out, in) int8 per output
   channel, x (rows, in) and y (rows, out) fp32.

   At one row a token's time is the bytes of weights read from memory, and an int8 weight is a quarter
   of an fp32 one. torch's only int8 x fp32 op on x86 (_weight_int8pack_mm) is a scalar loop on fp32
   input and rounds the input to bf16 in its vector form. Here the int8 values are widened to fp32 in
   registers and multiplied with the fp32 input: products of small integers and floats are exact, each
   output is summed in fp32 in input order (F.linear on the dequantised weight sums in another order),
   and the scale comes once at the end.

   The weight is read as tiles (quant/engines.py packs them once): TILE output channels side by side
   for each input, t[b, i, j] = q[b * TILE + j, i] (zero past the last channel), so each tile is one
   sequential stream, which the hardware prefetchers follow (measured on an AVX2 EPYC, the 48 Linears of
   GPT-2 small at one row: 5.0 ms a token on two threads, 8.0 ms reading q's rows four at a time, 31.5
   ms fp32). Each input broadcast is multiplied into TILE accumulators, eight AVX2 registers. Tiles are
   split over OpenMP threads (torch's pool: libgomp.so.1); every output is computed by one thread in
   one order, so a row's output depends on that row only, whatever the thread count or batch. */
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define TILE 64

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 widened(const int8_t *q) { /* 8 int8 -> 8 fp32 */
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* acc (TILE,) = the tile p (in, TILE) summed against x (in,) */
static void tile_sums(const int8_t *p, const float *x, long in, float *acc) {
    __m256 a[TILE / 8];
    for (int k = 0; k < TILE / 8; k++) a[k] = _mm256_setzero_ps();
    for (long i = 0; i < in; i++) {
        __m256 v = _mm256_broadcast_ss(x + i);
        const int8_t *r = p + i * TILE;
        for (int k = 0; k < TILE / 8; k++) a[k] = _mm256_fmadd_ps(widened(r + 8 * k), v, a[k]);
    }
    for (int k = 0; k < TILE / 8; k++) _mm256_storeu_ps(acc + 8 * k, a[k]);
}
#else
/* the same sums in portable C (TILE independent lanes: gcc vectorises them without reassociating) */
static void tile_sums(const int8_t *p, const float *x, long in, float *acc) {
    for (int j = 0; j < TILE; j++) acc[j] = 0.0f;
    for (long i = 0; i < in; i++)
        for (int j = 0; j < TILE; j++) acc[j] += (float)p[i * TILE + j] * x[i];
}
#endif

/* y (rows, out) = (x (rows, in) q^T) * scale (out,) + bias (out,) (bias may be NULL), q given as
   tiles (ceil(out / TILE), in, TILE); the tiles split over at most `threads` threads (torch's count) */
void w8a32(const int8_t *tiles, const float *scale, const float *bias, const float *x, long rows, long in,
           long out, float *y, int threads) {
    long count = (out + TILE - 1) / TILE;
    if (threads < 1 || count < 2 * threads) threads = 1;
    #pragma omp parallel num_threads(threads)
    {
        int n = omp_get_num_threads(), t = omp_get_thread_num();
        long per = (count + n - 1) / n, first = t * per, last = first + per < count ? first + per : count;
        float acc[TILE];
        for (long b = first; b < last; b++) {
            long o = b * TILE, width = out - o < TILE ? out - o : TILE;
            for (long r = 0; r < rows; r++) { /* the tile stays in L2 while the rows pass over it */
                tile_sums(tiles + b * in * TILE, x + r * in, in, acc);
                float *yr = y + r * out + o;
                for (long j = 0; j < width; j++)
                    yr[j] = bias != NULL ? acc[j] * scale[o + j] + bias[o + j] : acc[j] * scale[o + j];
            }
        }
    }
}
