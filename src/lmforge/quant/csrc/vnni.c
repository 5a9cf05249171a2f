/* u8 x s8 products at a few rows with AVX-512 VNNI, for dynamic int8 (quant/native.py builds this file
   beside rowquant.c, quant/engines.py calls it as the "u8-vnni" kernel): y = ((q - zp) w^T) * step * scale,
   q (rows, in) bytes quantised per row by rowquant.c, w (out, in) int8 per output channel.

   At a text's 14 rows oneDNN's dynamic int8 product costs ~40-55 us a call on MiniLM's shapes, mostly
   set-up (its packed weight's primitive, its own quantisation), where the sums themselves are 6 M
   multiply-adds. Here the weight is read as tiles packed once (quant/native.py): LANES output channels
   side by side, each with 4 consecutive inputs, t[b, g, j, k] = w[b LANES + j, 4 g + k] (zero past the
   last channel), so one 64-byte load feeds one vpdpbusd per row: 4 u8 x s8 products summed into each
   of 16 int32 lanes, exactly, without the int16 pair sums that saturate on AVX2. BLOCK rows share each
   load. The zero point comes off in int32 (zp times the channel's weight sum), then one conversion to
   fp32 and one product with step * scale. Tiles split over OpenMP threads (torch's pool: libgomp.so.1);
   every output is computed by one thread in one order, so a row's output depends on that row only.
   Compiled for AVX-512 VNNI by a target attribute only: the library's other code keeps torch's ISA, and
   quant/engines.py calls this function only where the CPU has the instruction. */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 9
#include <immintrin.h>

#define LANES 16 /* output channels a tile holds: one register of int32 sums */
#define BLOCK 8  /* rows summed against a tile at once: 8 accumulator registers */

/* y (rows, out) = ((q (rows, in) - zp) w^T) * step * scale (out,), w given as tiles
   (ceil(out / LANES), in / 4, LANES, 4) and its per-channel sums colsum (out,); in % 4 == 0 */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void u8_vnni(const int8_t *tiles, const int32_t *colsum, const float *scale, const uint8_t *q, long rows,
             long in, long out, int zp, float step, float *y, int threads) {
    long count = (out + LANES - 1) / LANES, groups = in / 4;
    if (threads < 1 || count < 2 * threads) threads = 1;
    #pragma omp parallel num_threads(threads)
    {
        int n = omp_get_num_threads(), t = omp_get_thread_num();
        long per = (count + n - 1) / n, first = t * per, last = first + per < count ? first + per : count;
        for (long b = first; b < last; b++) {
            const int8_t *tile = tiles + b * groups * 64;
            long o = b * LANES, width = out - o < LANES ? out - o : LANES;
            __mmask16 mask = (__mmask16)((1u << width) - 1);
            __m512 mult = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, scale + o), _mm512_set1_ps(step));
            __m512i zc = _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(mask, colsum + o),
                                            _mm512_set1_epi32(zp));
            for (long r0 = 0; r0 < rows; r0 += BLOCK) {
                long nr = rows - r0 < BLOCK ? rows - r0 : BLOCK;
                const uint8_t *xr[BLOCK];
                __m512i a[BLOCK];
                for (int k = 0; k < BLOCK; k++) { /* past the last row: row r0 again, its sums unused */
                    xr[k] = q + (r0 + (k < nr ? k : 0)) * in;
                    a[k] = _mm512_setzero_si512();
                }
                for (long g = 0; g < groups; g++) {
                    __m512i w = _mm512_loadu_si512((const void *)(tile + g * 64));
                    for (int k = 0; k < BLOCK; k++) {
                        int32_t four;
                        memcpy(&four, xr[k] + 4 * g, 4);
                        a[k] = _mm512_dpbusd_epi32(a[k], _mm512_set1_epi32(four), w);
                    }
                }
                for (int k = 0; k < nr; k++) {
                    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[k], zc)), mult);
                    _mm512_mask_storeu_ps(y + (r0 + k) * out + o, mask, v);
                }
            }
        }
    }
}
#endif
