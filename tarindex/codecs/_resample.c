/* Antialiased resize of a box of a uint8 image: Pillow's bilinear resize, bit for bit.
 *
 * The compiled half of tarindex.codecs.resample; its pure-Python (numpy) twin is
 * tarindex/codecs/_resample_py.py (same function, same pixels, same errors).
 *
 *   resample(src, x0, y0, x1, y1, out) -> None
 *
 * src is a uint8 buffer (h, w, c), 1 <= c <= 4, its pixels contiguous within a row (strides
 * (any, c, 1)); out a writable uint8 buffer (H, W, c) of any strides: (W*c, c, 1) is HWC,
 * (W, 1, H*W) a slot of a CHW batch, a negative column stride a left-right flip. The box
 * (x0, y0, x1, y1), in src pixels, 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, is resized to
 * H x W, as Pillow's Image.resize((W, H), BILINEAR, box=(x0, y0, x1, y1)) resizes it
 * (libImaging/Resample.c): the box rounded to float32; per output column (then row) the
 * triangle filter, widened by the scale when shrinking (support = max(scale, 1)), centred on
 * the output pixel's centre in src, over the src pixels it reaches (past the box, clamped to
 * src's edges), normalised to sum 1 and rounded to 22-bit fixed point; two passes (their
 * order is Pillow's: two_pass below), the first rounded and clipped to uint8 over only the
 * rows or columns the second reads. The vertical pass sums whole rows (W * c contiguous int32
 * sums, which compilers vectorise); the horizontal one a few taps per output pixel. The GIL is
 * released for both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BITS 22 /* Pillow's PRECISION_BITS for 8-bit images: 32 - 8 - 2 */
#define HALF (1 << (BITS - 1))

/* AVX2 copy of the passes beside the baseline one, picked at load time (GCC on x86-64 Linux) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

typedef struct {
    int ksize;  /* coefficients stored per output pixel */
    int *lo;    /* first src pixel of each output pixel */
    int *n;     /* how many src pixels it reads */
    int32_t *k; /* out_size x ksize fixed-point weights */
} Coeffs;

static void coeffs_free(Coeffs *c)
{
    free(c->lo);
    free(c->n);
    free(c->k);
    c->lo = c->n = NULL;
    c->k = NULL;
}

static double triangle(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for its bilinear filter; 0 on no memory */
static int coeffs_make(int in_size, float in0, float in1, int out_size, Coeffs *c)
{
    double scale = (double)(in1 - in0) / out_size; /* the difference in float32, as Pillow */
    double fs = scale < 1.0 ? 1.0 : scale;
    double support = fs; /* the triangle's support is 1 */
    double ss = 1.0 / fs;
    int ksize = (int)ceil(support) * 2 + 1;
    double *w = malloc((size_t)ksize * sizeof(double));
    c->ksize = ksize;
    c->lo = malloc((size_t)out_size * sizeof(int));
    c->n = malloc((size_t)out_size * sizeof(int));
    c->k = calloc((size_t)out_size * (size_t)ksize, sizeof(int32_t));
    if (w == NULL || c->lo == NULL || c->n == NULL || c->k == NULL) {
        free(w);
        coeffs_free(c);
        return 0;
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale, ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            w[x] = triangle((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        int32_t *k = c->k + (size_t)xx * (size_t)ksize;
        for (int x = 0; x < xmax; x++) {
            double v = ww != 0.0 ? w[x] / ww : w[x];
            k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << BITS)) : (int32_t)(0.5 + v * (1 << BITS));
        }
        c->lo[xx] = xmin;
        c->n[xx] = xmax;
    }
    free(w);
    return 1;
}

static inline uint8_t clip8(int32_t v)
{
    v >>= BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Three-channel rows, two at a time: widen2 widens rows s0 and s1 (3 w bytes each) to int32 rows
 * at wide and wide + 4 w (each closed by a 0, so a pixel's four values R, G, B and the next
 * pixel's R can be read as one vector up to the last pixel); taps8 then sums a pixel's taps for
 * both rows as one 8-lane multiply-add a tap (the four values of row 0, then of row 1) and gives
 * v[r] = clip8(HALF + sum over the n taps of row_r[3 x + c] * k[x]) for c < 4, packed in a
 * uint32 (c = 0 in the low byte). The widening is a plain loop over contiguous bytes, which
 * compilers vectorise; the taps use GCC's vector extension, plain loops elsewhere (and with
 * -DTARINDEX_PLAIN_C, how the tests build that path). */
static inline void widen2(const uint8_t *s0, const uint8_t *s1, int w, int32_t *wide)
{
    int32_t *w0 = wide, *w1 = wide + 4 * (size_t)w;
    int n = 3 * w;
    for (int i = 0; i < n; i++)
        w0[i] = s0[i];
    for (int i = 0; i < n; i++)
        w1[i] = s1[i];
    w0[n] = w1[n] = 0;
}

#if defined(__GNUC__) && !defined(__clang__) && !defined(TARINDEX_PLAIN_C)
typedef uint8_t v16u __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) uint32_t pack4(v4i acc)
{
    const v16u zero = {0}, pack = {0, 4, 8, 12, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16};
    acc >>= BITS;
    acc &= ~(acc < 0);
    v4i big = acc > 255;
    acc = (acc & ~big) | (big & 255);
    return (uint32_t)((v4i)__builtin_shuffle((v16u)acc, zero, pack))[0];
}

/* p: the first tap's pixel in row 0; q: the offset of row 1 (in int32) */
static inline __attribute__((always_inline)) void taps8(const int32_t *p, size_t q,
                                                         const int32_t *k, int n, uint32_t *v)
{
    v8i acc = {HALF, HALF, HALF, HALF, HALF, HALF, HALF, HALF};
    for (int x = 0; x < n; x++) {
        v4i t0, t1;
        memcpy(&t0, p + 3 * x, sizeof t0);
        memcpy(&t1, p + 3 * x + q, sizeof t1);
        acc += __builtin_shufflevector(t0, t1, 0, 1, 2, 3, 4, 5, 6, 7) * k[x];
    }
    v4i lo = {acc[0], acc[1], acc[2], acc[3]}, hi = {acc[4], acc[5], acc[6], acc[7]};
    v[0] = pack4(lo);
    v[1] = pack4(hi);
}
#else
static inline void taps8(const int32_t *p, size_t q, const int32_t *k, int n, uint32_t *v)
{
    for (int r = 0; r < 2; r++) {
        int32_t a[4] = {HALF, HALF, HALF, HALF};
        for (int x = 0; x < n; x++)
            for (int c = 0; c < 4; c++)
                a[c] += p[(size_t)r * q + 3 * (size_t)x + (size_t)c] * k[x];
        v[r] = (uint32_t)clip8(a[0]) | (uint32_t)clip8(a[1]) << 8 |
               (uint32_t)clip8(a[2]) << 16 | (uint32_t)clip8(a[3]) << 24;
    }
}
#endif

#define BLOCK 32 /* the vertical pass's sums kept in registers while its taps go by */

/* acc[j] = HALF + sum over the n rows y of row_y[j] * k[y], j < BLOCK, row_y = p + y * rs */
static inline void rows_block(const uint8_t *p, Py_ssize_t rs, const int32_t *k, int n,
                              int32_t *acc)
{
    int32_t a[BLOCK];
    for (int j = 0; j < BLOCK; j++)
        a[j] = HALF;
    for (int y = 0; y < n; y++) {
        const uint8_t *row = p + (Py_ssize_t)y * rs;
        int32_t wy = k[y];
        for (int j = 0; j < BLOCK; j++)
            a[j] += row[j] * wy;
    }
    for (int j = 0; j < BLOCK; j++)
        acc[j] = a[j];
}

/* The horizontal pass: `rows` rows of `src` (row stride `rs`, `w` pixels each, contiguous) ->
 * rows of out_w pixels at `dst` (strides ds[0] row, ds[1] pixel, ds[2] channel). For 3 channels
 * rows go two at a time, widened into `wide` (two int32 rows), a tap one 8-lane multiply-add for
 * both; other channel counts go tap by tap. `padded`: dst is ours, and a pixel but a row's
 * last may be stored as 4 bytes (the fourth is the next pixel's, stored next). */
CLONES static void hpass(const uint8_t *src, Py_ssize_t rs, int rows, int w, int nc,
                         const Coeffs *c, int out_w, uint8_t *dst, const Py_ssize_t *ds,
                         int32_t *wide, int padded)
{
    Py_ssize_t d0 = ds[0], d1 = ds[1], d2 = ds[2];
    int packed = padded && d1 == 3 && d2 == 1; /* 4-byte stores: contiguous rows of ours */
    for (int r = 0; r < rows; r++) {
        const uint8_t *s = src + (Py_ssize_t)r * rs;
        uint8_t *d = dst + (Py_ssize_t)r * d0;
        if (nc == 3) { /* rows r and r + 1 (r again when it is the last) */
            widen2(s, r + 1 < rows ? s + rs : s, w, wide);
            for (int xo = 0; xo < out_w; xo++) {
                uint32_t v[2];
                taps8(wide + 3 * (size_t)c->lo[xo], 4 * (size_t)w,
                      c->k + (size_t)xo * (size_t)c->ksize, c->n[xo], v);
                for (int i = 0; i < 2 && r + i < rows; i++) {
                    uint8_t *o = d + (Py_ssize_t)i * d0 + (Py_ssize_t)xo * d1;
                    if (packed && xo + 1 < out_w) { /* the fourth byte: the next pixel's */
                        memcpy(o, &v[i], 4);
                    } else {
                        o[0] = (uint8_t)v[i];
                        o[d2] = (uint8_t)(v[i] >> 8);
                        o[2 * d2] = (uint8_t)(v[i] >> 16);
                    }
                }
            }
            r++;
            continue;
        }
        for (int xo = 0; xo < out_w; xo++) {
            const int32_t *k = c->k + (size_t)xo * (size_t)c->ksize;
            const uint8_t *p = s + (size_t)c->lo[xo] * (size_t)nc;
            uint8_t *o = d + (Py_ssize_t)xo * d1;
            for (int ch = 0; ch < nc; ch++) {
                int32_t a = HALF;
                for (int x = 0, n = c->n[xo]; x < n; x++)
                    a += p[nc * x + ch] * k[x];
                o[ch * d2] = clip8(a);
            }
        }
    }
}

/* A row of 3-channel pixels (row8) to three planes, 16 pixels a step: returns how many pixels it
 * laid out (a multiple of 16; the caller does the rest). step 1: o_c[x] = row8[3 x + c]; step -1:
 * o_c[-x] (a flipped row). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(TARINDEX_PLAIN_C)
static inline __attribute__((always_inline)) int planes16(const uint8_t *row8, int width, int step,
                                                           uint8_t *o0, uint8_t *o1, uint8_t *o2)
{
    const v16u m0[3] = {{0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0, 0, 0, 0, 0},
                        {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 0, 0, 0, 0, 0},
                        {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0, 0, 0, 0, 0, 0}};
    const v16u m1[3] = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 20, 23, 26, 29},
                        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 18, 21, 24, 27, 30},
                        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19, 22, 25, 28, 31}};
    const v16u rev = {15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    uint8_t *o[3] = {o0, o1, o2};
    int xo = 0;
    for (; xo + 16 <= width; xo += 16) {
        v16u a, b, c;
        memcpy(&a, row8 + 3 * xo, 16);
        memcpy(&b, row8 + 3 * xo + 16, 16);
        memcpy(&c, row8 + 3 * xo + 32, 16);
        for (int ch = 0; ch < 3; ch++) {
            v16u p = __builtin_shuffle(__builtin_shuffle(a, b, m0[ch]), c, m1[ch]);
            if (step == 1) {
                memcpy(o[ch] + xo, &p, 16);
            } else {
                p = __builtin_shuffle(p, rev);
                memcpy(o[ch] - xo - 15, &p, 16);
            }
        }
    }
    return xo;
}
#else
static inline int planes16(const uint8_t *row8, int width, int step, uint8_t *o0, uint8_t *o1,
                           uint8_t *o2)
{
    (void)row8, (void)width, (void)step, (void)o0, (void)o1, (void)o2;
    return 0;
}
#endif

/* The vertical pass: rows of `src` (row stride `rs`; row 0 is the image's row `first`), each
 * `width` pixels wide -> out_h rows at `dst` (strides ds[0] row, ds[1] pixel, ds[2] channel).
 * Each output row sums whole input rows, BLOCK values at a time (a fixed-length loop over
 * contiguous bytes, which compilers vectorise), into `acc` (width * nc int32, then as many
 * bytes). */
CLONES static void vpass(const uint8_t *src, Py_ssize_t rs, int first, const Coeffs *c,
                         int out_h, int width, int nc, int32_t *acc, uint8_t *dst,
                         const Py_ssize_t *ds)
{
    int len = width * nc;
    for (int yo = 0; yo < out_h; yo++) {
        const int32_t *k = c->k + (size_t)yo * (size_t)c->ksize;
        const uint8_t *base = src + (Py_ssize_t)(c->lo[yo] - first) * rs;
        int n = c->n[yo], i = 0;
        for (; i + BLOCK <= len; i += BLOCK)
            rows_block(base + i, rs, k, n, acc + i);
        for (; i < len; i++) {
            int32_t a = HALF;
            for (int y = 0; y < n; y++)
                a += base[(Py_ssize_t)y * rs + i] * k[y];
            acc[i] = a;
        }
        uint8_t *o = dst + (Py_ssize_t)yo * ds[0];
        if (ds[1] == nc && ds[2] == 1) {
            for (int j = 0; j < len; j++)
                o[j] = clip8(acc[j]);
            continue;
        }
        uint8_t *row8 = (uint8_t *)(acc + len); /* the row clipped, then laid out */
        for (int j = 0; j < len; j++)
            row8[j] = clip8(acc[j]);
        if (nc == 3 && (ds[1] == 1 || ds[1] == -1)) { /* a CHW slot, flipped or not */
            uint8_t *o0 = o, *o1 = o + ds[2], *o2 = o + 2 * ds[2];
            int xo = planes16(row8, width, (int)ds[1], o0, o1, o2);
            if (ds[1] == 1) {
                for (; xo < width; xo++) {
                    o0[xo] = row8[3 * xo];
                    o1[xo] = row8[3 * xo + 1];
                    o2[xo] = row8[3 * xo + 2];
                }
            } else {
                for (; xo < width; xo++) {
                    o0[-xo] = row8[3 * xo];
                    o1[-xo] = row8[3 * xo + 1];
                    o2[-xo] = row8[3 * xo + 2];
                }
            }
        } else {
            for (int xo = 0; xo < width; xo++)
                for (int ch = 0; ch < nc; ch++)
                    o[(Py_ssize_t)xo * ds[1] + (Py_ssize_t)ch * ds[2]] = row8[nc * xo + ch];
        }
    }
}

/* Both passes, in Pillow's order; 0 when out of memory. Pillow (from 13.0) resizes vertically
 * first when the height shrinks by more than twice what the width does (in pixels of the
 * whole src: h - H > 2 (w - W)), else horizontally first; the intermediate rows are rounded
 * to uint8 either way, so the order is part of the result. The first pass covers only the
 * rows (columns) the second one reads. */
static int two_pass(const uint8_t *src, Py_ssize_t rs, int h, int w, int nc, const float *f,
                    uint8_t *out, const Py_ssize_t *os, int oh, int ow)
{
    Coeffs ch = {0, NULL, NULL, NULL}, cv = {0, NULL, NULL, NULL};
    uint8_t *tmp = NULL;
    int32_t *acc = NULL;
    int32_t *wide = calloc((size_t)w * 8, sizeof(int32_t));
    int ok = 0;
    if (wide == NULL || !coeffs_make(h, f[1], f[3], oh, &cv) ||
        !coeffs_make(w, f[0], f[2], ow, &ch))
        goto done;
    if (oh < h && h - oh > 2 * (w - ow)) {
        int first = ch.lo[0], last = ch.lo[ow - 1] + ch.n[ow - 1], width = last - first;
        Py_ssize_t ts[3] = {(Py_ssize_t)width * nc, nc, 1};
        tmp = malloc((size_t)oh * (size_t)width * (size_t)nc);
        acc = malloc((size_t)width * (size_t)nc * (sizeof(int32_t) + 1));
        if (tmp == NULL || acc == NULL)
            goto done;
        vpass(src + (Py_ssize_t)first * nc, rs, 0, &cv, oh, width, nc, acc, tmp, ts);
        for (int i = 0; i < ow; i++)
            ch.lo[i] -= first;
        hpass(tmp, ts[0], oh, width, nc, &ch, ow, out, os, wide, 0);
    } else {
        int first = cv.lo[0], last = cv.lo[oh - 1] + cv.n[oh - 1];
        Py_ssize_t ts[3] = {(Py_ssize_t)ow * nc, nc, 1};
        const uint8_t *rows = src + (Py_ssize_t)first * rs;
        Py_ssize_t rows_stride = rs;
        if (ow != w || f[0] != 0.0f || f[2] != (float)w) { /* else the pass is the identity */
            tmp = malloc((size_t)(last - first) * (size_t)ow * (size_t)nc);
            if (tmp == NULL)
                goto done;
            hpass(rows, rs, last - first, w, nc, &ch, ow, tmp, ts, wide, 1);
            rows = tmp;
            rows_stride = ts[0];
        }
        acc = malloc((size_t)ow * (size_t)nc * (sizeof(int32_t) + 1));
        if (acc == NULL)
            goto done;
        vpass(rows, rows_stride, first, &cv, oh, ow, nc, acc, out, os);
    }
    ok = 1;
done:
    coeffs_free(&ch);
    coeffs_free(&cv);
    free(tmp);
    free(acc);
    free(wide);
    return ok;
}

static int is_u8(const Py_buffer *b)
{
    return b->itemsize == 1 && (b->format == NULL || strcmp(b->format, "B") == 0);
}

static PyObject *resample(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *src_obj, *out_obj;
    double bx[4];
    if (!PyArg_ParseTuple(args, "OddddO", &src_obj, &bx[0], &bx[1], &bx[2], &bx[3], &out_obj))
        return NULL;
    Py_buffer src, out;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_RECORDS_RO) < 0)
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_RECORDS) < 0) {
        PyBuffer_Release(&src);
        if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "resample: out is not a writable array");
        }
        return NULL;
    }
    PyObject *result = NULL;
    if (src.ndim != 3 || out.ndim != 3 || !is_u8(&src) || !is_u8(&out)) {
        PyErr_SetString(PyExc_ValueError,
                        "resample: src and out must be uint8 arrays of 3 dimensions (h, w, c)");
        goto done;
    }
    Py_ssize_t h = src.shape[0], w = src.shape[1], nc = src.shape[2];
    Py_ssize_t oh = out.shape[0], ow = out.shape[1];
    if (nc < 1 || nc > 4 || out.shape[2] != nc || h < 1 || w < 1 || oh < 1 || ow < 1 ||
        h > INT_MAX / 4 || w > INT_MAX / 4 || oh > INT_MAX / 4 || ow * nc > INT_MAX / 4) {
        PyErr_Format(PyExc_ValueError,
                     "resample: src (%zd, %zd, %zd) to out (%zd, %zd, %zd): expected sides >= 1 "
                     "and the same 1 to 4 channels",
                     h, w, nc, oh, ow, out.shape[2]);
        goto done;
    }
    if (src.strides[2] != 1 || src.strides[1] != nc) {
        PyErr_SetString(PyExc_ValueError,
                        "resample: src's pixels must be contiguous within a row (strides "
                        "(any, c, 1)): pass numpy.ascontiguousarray(src)");
        goto done;
    }
    int inside = 1;
    for (int i = 0; i < 4; i++)
        inside = inside && isfinite(bx[i]) && bx[i] >= 0;
    if (!inside || bx[2] <= bx[0] || bx[3] <= bx[1] || bx[2] > (double)w || bx[3] > (double)h) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "resample: box (%g, %g, %g, %g) is not inside the %zdx%zd image with x0 < x1 "
                 "and y0 < y1",
                 bx[0], bx[1], bx[2], bx[3], w, h);
        PyErr_SetString(PyExc_ValueError, msg);
        goto done;
    }
    float f[4] = {(float)bx[0], (float)bx[1], (float)bx[2], (float)bx[3]};
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = two_pass((const uint8_t *)src.buf, src.strides[0], (int)h, (int)w, (int)nc, f,
                  (uint8_t *)out.buf, out.strides, (int)oh, (int)ow);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"resample", resample, METH_VARARGS,
     "resample(src, x0, y0, x1, y1, out) -> None: the box of src resized into out (Pillow's "
     "antialiased bilinear, bit for bit)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_resample", "Antialiased uint8 resize (Pillow's bilinear filter).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__resample(void) { return PyModule_Create(&module); }
