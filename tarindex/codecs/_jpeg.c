/* Region-of-interest JPEG decoding over libjpeg-turbo: a box of a JPEG at a DCT scale.
 *
 * The compiled half of tarindex.codecs.jpeg.decode_region; its pure-Python twin there decodes
 * the whole image at the same scale (simplejpeg or Pillow) and slices the same region.
 *
 *   header(data) -> (width, height, jpeg_color_space)
 *   decode(data, denom, x0, y0, x1, y1, out) -> (xoffset, width)
 *   stream_fault(data) -> None | (kind, offset, marker)
 *
 * decode() decodes rows [y0, y1) and at least columns [x0, x1) of the image scaled by
 * 1/denom (denom 1, 2, 4 or 8; coordinates in scaled pixels) as RGB into the writable
 * buffer out, row after row, each row `width` pixels (3 bytes each) starting at scaled
 * column `xoffset` <= x0 (libjpeg-turbo widens a crop to its iMCU columns). Only the rows
 * down to y1 are read (the entropy decoding stops there), rows above y0 are skipped without
 * their IDCT (jpeg_skip_scanlines), columns outside the widened crop are not transformed
 * (jpeg_crop_scanline). The GIL is released for the whole decode (and for stream_fault's
 * walk). Errors (a corrupt stream, a colour space libjpeg cannot give as RGB, an out buffer too
 * small) raise ValueError with libjpeg's message; warnings (a truncated scan, ...) are not
 * errors, as Pillow and simplejpeg (strict=False) treat them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

struct err_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr c)
{
    struct err_mgr *e = (struct err_mgr *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

static void on_message(j_common_ptr c, int level)
{
    (void)c;
    (void)level; /* warnings and traces: not errors, not printed */
}

static PyObject *header(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    struct jpeg_decompress_struct cinfo;
    struct err_mgr jerr;
    int w = 0, h = 0, cs = 0, failed = 0;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = on_error;
    jerr.pub.emit_message = on_message;
    jerr.msg[0] = 0;
    jpeg_create_decompress(&cinfo);
    if (setjmp(jerr.jb)) {
        failed = 1;
    } else {
        jpeg_mem_src(&cinfo, (const unsigned char *)buf.buf, (unsigned long)buf.len);
        jpeg_read_header(&cinfo, TRUE);
        w = (int)cinfo.image_width;
        h = (int)cinfo.image_height;
        cs = (int)cinfo.jpeg_color_space;
    }
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&buf);
    if (failed) {
        PyErr_Format(PyExc_ValueError, "libjpeg: %s", jerr.msg);
        return NULL;
    }
    return Py_BuildValue("iii", w, h, cs);
}

/* Kind 1: cut (no EOI after the first scan), kind 2: a marker inside entropy-coded data,
 * kind 3: a marker segment running past the end.
 * The compiled twin of tarindex.codecs.jpeg.stream_fault (its docstring has the rule). */
static int is_segment(unsigned m)
{
    return m == 0xC4 || m == 0xCC || m == 0xDA || m == 0xDB || m == 0xDC || m == 0xDD ||
           m == 0xFE || (m >= 0xE0 && m <= 0xEF);
}

static PyObject *stream_fault(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = (const unsigned char *)buf.buf;
    Py_ssize_t n = buf.len, i = 2, j = 0;
    int scan = 0, kind = 0, restarts = 0;
    unsigned m = 0;
    if (n < 2 || b[0] != 0xFF || b[1] != 0xD8)
        goto done; /* not a JPEG: the decoder says so */
    Py_BEGIN_ALLOW_THREADS /* the walk reads only the held buffer */
    for (;;) {
        const unsigned char *p = i < n ? memchr(b + i, 0xFF, (size_t)(n - i)) : NULL;
        if (p == NULL || (j = p - b) + 1 >= n) {
            kind = 1;
            break;
        }
        m = b[j + 1];
        if (m == 0xFF || m == 0 || (m >= 0xD0 && m <= 0xD7) || (!scan && (m == 0x01 || m == 0xD8))) {
            i = m == 0xFF ? j + 1 : j + 2;
            continue;
        }
        if (m == 0xD9) {
            kind = scan ? 0 : 1;
            break;
        }
        if (scan && !is_segment(m)) {
            if (m < 0xC0 && restarts) { /* libjpeg resyncs at the next restart marker */
                i = j + 2;
                continue;
            }
            kind = 2;
            break;
        }
        if (j + 4 > n) {
            kind = 1;
            break;
        }
        if (m == 0xDD && j + 6 <= n)
            restarts = (b[j + 4] << 8 | b[j + 5]) != 0;
        i = j + 2 + ((Py_ssize_t)b[j + 2] << 8 | b[j + 3]);
        if (i > n) {
            kind = 3;
            break;
        }
        scan = scan || m == 0xDA;
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&buf);
    if (kind == 0)
        Py_RETURN_NONE;
    if (kind == 1)
        return Py_BuildValue("inI", 1, n, 0u);
    return Py_BuildValue("inI", kind, j, 0xFF00u | m);
}

static PyObject *decode(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer src, out;
    int denom, x0, y0, x1, y1;
    if (!PyArg_ParseTuple(args, "y*iiiiiw*", &src, &denom, &x0, &y0, &x1, &y1, &out))
        return NULL;
    if (!(denom == 1 || denom == 2 || denom == 4 || denom == 8) || x0 < 0 || y0 < 0 ||
        x1 <= x0 || y1 <= y0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError,
                     "decode: denom %d, region [%d, %d) x [%d, %d): expected denom in 1, 2, 4, "
                     "8 and a non-empty region",
                     denom, x0, x1, y0, y1);
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct err_mgr jerr;
    int failed = 0, small = 0;
    JDIMENSION xoff = (JDIMENSION)x0, cw = 0, ow = 0, oh = 0;
    unsigned char *dst = (unsigned char *)out.buf;
    Py_ssize_t cap = out.len;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = on_error;
    jerr.pub.emit_message = on_message;
    jerr.msg[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    jpeg_create_decompress(&cinfo);
    if (setjmp(jerr.jb)) {
        failed = 1;
    } else {
        jpeg_mem_src(&cinfo, (const unsigned char *)src.buf, (unsigned long)src.len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_RGB;
        cinfo.scale_num = 1;
        cinfo.scale_denom = (unsigned int)denom;
        jpeg_start_decompress(&cinfo);
        ow = cinfo.output_width;
        oh = cinfo.output_height;
        if ((JDIMENSION)x1 > ow || (JDIMENSION)y1 > oh) {
            small = 2;
        } else {
            cw = (JDIMENSION)(x1 - x0);
            if (cw < ow)
                jpeg_crop_scanline(&cinfo, &xoff, &cw);
            else
                xoff = 0;
            cw = cinfo.output_width;
            if ((Py_ssize_t)(y1 - y0) * (Py_ssize_t)cw * 3 > cap) {
                small = 1;
            } else {
                if (y0 > 0)
                    jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0);
                JSAMPROW rows[16];
                while (cinfo.output_scanline < (JDIMENSION)y1) {
                    JDIMENSION at = cinfo.output_scanline, k, want = (JDIMENSION)y1 - at;
                    if (want > 16)
                        want = 16;
                    for (k = 0; k < want; k++)
                        rows[k] = dst + (size_t)(at + k - (JDIMENSION)y0) * cw * 3;
                    jpeg_read_scanlines(&cinfo, rows, want);
                }
            }
        }
        jpeg_abort_decompress(&cinfo);
    }
    jpeg_destroy_decompress(&cinfo);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (failed) {
        PyErr_Format(PyExc_ValueError, "libjpeg: %s", jerr.msg);
        return NULL;
    }
    if (small == 2) {
        PyErr_Format(PyExc_ValueError,
                     "decode: region to (%d, %d) is outside the %ux%u image at 1/%d", x1, y1,
                     ow, oh, denom);
        return NULL;
    }
    if (small) {
        PyErr_Format(PyExc_ValueError, "decode: out holds %zd bytes, %d rows of %u pixels need more",
                     cap, y1 - y0, cw);
        return NULL;
    }
    return Py_BuildValue("II", xoff, cw);
}

static PyMethodDef methods[] = {
    {"header", header, METH_O, "header(data) -> (width, height, jpeg_color_space)"},
    {"decode", decode, METH_VARARGS,
     "decode(data, denom, x0, y0, x1, y1, out) -> (xoffset, width): a region at 1/denom"},
    {"stream_fault", stream_fault, METH_O,
     "stream_fault(data) -> None | (kind, offset, marker): a cut or corrupt JPEG stream"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpeg", "Region-of-interest JPEG decoding over libjpeg-turbo.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0 ||
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
        PyModule_AddIntConstant(m, "TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER) < 0 ||
#else
        PyModule_AddIntConstant(m, "TURBO_VERSION", 0) < 0 ||
#endif
        0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
