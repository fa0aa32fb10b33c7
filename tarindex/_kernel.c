/* tarindex._kernel: the read kernel's per-sample loops, compiled (optional; see docs/READING.md).
 *
 * Every function here reads tables that tarindex/reader.py has already validated chunk by
 * chunk (check_samples): the guards live there, once. These loops still bound every read
 * they make (a pointer past its table, a member past the tar, an extension id past the
 * extension list) and, instead of raising, hand the case back: the caller then takes the
 * pure-Python path, which checks the chunk and raises the FormatError that names the index.
 * Tables are little-endian (FORMAT.md section 2); the module is only used on little-endian
 * hosts. Without this module (no compiler at install, or TARINDEX_PURE_PYTHON=1) the same
 * loops run in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CHUNK_SHIFT 10 /* reader.CHUNK_SHIFT */

/* ---- Tables: one open shard's tables and tar bytes, pinned while the object lives ------ */

typedef struct {
    PyObject_HEAD
    Py_buffer kp, sp, keys, eid, off, size, data, checked;
    int nbuf;            /* how many of the buffers above are held (released in reverse) */
    Py_ssize_t n;        /* samples */
    Py_ssize_t members;  /* entries of eid/off/size */
    Py_ssize_t kbase;    /* where the key blob starts in `keys` */
    Py_ssize_t kend;     /* where it ends */
    PyObject *exts;      /* tuple of str: extension names by id */
    Py_ssize_t n_exts;
} Tables;

static Py_buffer *tables_buf(Tables *t, int i) {
    Py_buffer *all[] = {&t->kp, &t->sp, &t->keys, &t->eid, &t->off, &t->size, &t->data, &t->checked};
    return all[i];
}

static void Tables_dealloc(Tables *t) {
    while (t->nbuf > 0) PyBuffer_Release(tables_buf(t, --t->nbuf));
    Py_XDECREF(t->exts);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static int Tables_init(Tables *t, PyObject *args, PyObject *kw) {
    static char *names[] = {"key_ptr", "sample_ptr", "keys", "key_base", "key_end", "ext_id",
                            "offset", "size", "data", "exts", "checked", NULL};
    PyObject *obj[11];
    if (t->nbuf) {
        PyErr_SetString(PyExc_TypeError, "Tables is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOnnOOOOO!O:Tables", names, &obj[0], &obj[1],
                                     &obj[2], &t->kbase, &t->kend, &obj[5], &obj[6], &obj[7],
                                     &obj[8], &PyTuple_Type, &obj[9], &obj[10]))
        return -1;
    int order[] = {0, 1, 2, 5, 6, 7, 8, 10};
    for (int i = 0; i < 8; i++) {
        int flags = i == 7 ? PyBUF_WRITABLE : PyBUF_SIMPLE;
        if (PyObject_GetBuffer(obj[order[i]], tables_buf(t, i), flags) < 0) return -1;
        t->nbuf = i + 1;
    }
    if (t->kp.len % 8 || t->sp.len % 8 || t->off.len % 8 || t->size.len % 8 || t->eid.len % 4 ||
        t->kp.len < 8 || t->kp.len != t->sp.len || t->off.len != t->size.len ||
        t->off.len / 8 != t->eid.len / 4 || t->kbase < 0 || t->kend < t->kbase ||
        t->kend > t->keys.len) {
        PyErr_SetString(PyExc_ValueError, "Tables: inconsistent table lengths");
        return -1;
    }
    t->n = t->kp.len / 8 - 1;
    t->members = t->eid.len / 4;
    if (t->checked.len < ((t->n + (1 << CHUNK_SHIFT) - 1) >> CHUNK_SHIFT)) {
        PyErr_SetString(PyExc_ValueError, "Tables: chunk flags shorter than the sample count");
        return -1;
    }
    Py_INCREF(obj[9]);
    t->exts = obj[9];
    t->n_exts = PyTuple_GET_SIZE(obj[9]);
    return 0;
}

/* Sample j's key and member run, bounded; 0 = hand back (unchecked chunk or out of bounds). */
static int tables_row(Tables *t, Py_ssize_t j, uint64_t *k0, uint64_t *k1, uint64_t *m0,
                      uint64_t *m1) {
    const uint64_t *kp = t->kp.buf, *sp = t->sp.buf;
    if (j < 0 || j >= t->n || !((const char *)t->checked.buf)[j >> CHUNK_SHIFT]) return 0;
    *k0 = kp[j];
    *k1 = kp[j + 1];
    *m0 = sp[j];
    *m1 = sp[j + 1];
    return *k0 <= *k1 && *k1 <= (uint64_t)(t->kend - t->kbase) && *m0 <= *m1 &&
           *m1 <= (uint64_t)t->members;
}

static int member_ok(Tables *t, uint64_t m, Py_ssize_t data_len) {
    uint64_t o = ((const uint64_t *)t->off.buf)[m], s = ((const uint64_t *)t->size.buf)[m];
    return ((const uint32_t *)t->eid.buf)[m] < (uint64_t)t->n_exts && o <= (uint64_t)data_len &&
           s <= (uint64_t)data_len - o;
}

/* sample(j, want, shard, index) -> {"__key__", ext: bytes..., "__shard__", "__index__"} | None
 * want: None (every member) or bytes, want[ext_id] != 0 for the extensions to read. */
static PyObject *Tables_sample(Tables *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "sample(j, want, shard, index)");
        return NULL;
    }
    Py_ssize_t j = PyLong_AsSsize_t(args[0]);
    if (j == -1 && PyErr_Occurred()) return NULL;
    const char *want = NULL;
    if (args[1] != Py_None) {
        if (!PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) < t->n_exts) {
            PyErr_SetString(PyExc_TypeError, "want: bytes of one flag per extension");
            return NULL;
        }
        want = PyBytes_AS_STRING(args[1]);
    }
    uint64_t k0, k1, m0, m1;
    if (!tables_row(t, j, &k0, &k1, &m0, &m1)) Py_RETURN_NONE;
    for (uint64_t m = m0; m < m1; m++)
        if (!member_ok(t, m, t->data.len)) Py_RETURN_NONE;
    const uint64_t *off = t->off.buf, *sz = t->size.buf;
    const uint32_t *eid = t->eid.buf;
    const char *data = t->data.buf;
    PyObject *d = PyDict_New(), *v;
    if (d == NULL) return NULL;
    v = PyUnicode_DecodeUTF8((const char *)t->keys.buf + t->kbase + k0, (Py_ssize_t)(k1 - k0),
                             "surrogateescape");
    if (v == NULL || PyDict_SetItemString(d, "__key__", v) < 0) goto fail;
    Py_DECREF(v);
    for (uint64_t m = m0; m < m1; m++) {
        if (want != NULL && !want[eid[m]]) continue;
        v = PyBytes_FromStringAndSize(data + off[m], (Py_ssize_t)sz[m]);
        if (v == NULL || PyDict_SetItem(d, PyTuple_GET_ITEM(t->exts, eid[m]), v) < 0) goto fail;
        Py_DECREF(v);
    }
    v = NULL;
    if (PyDict_SetItemString(d, "__shard__", args[2]) < 0 ||
        PyDict_SetItemString(d, "__index__", args[3]) < 0)
        goto fail;
    return d;
fail:
    Py_XDECREF(v);
    Py_DECREF(d);
    return NULL;
}

static PyMethodDef Tables_methods[] = {
    {"sample", (PyCFunction)(void (*)(void))Tables_sample, METH_FASTCALL,
     "sample(j, want, shard, index): sample j as a dict, or None (take the Python path)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject TablesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarindex._kernel.Tables",
    .tp_basicsize = sizeof(Tables),
    .tp_dealloc = (destructor)Tables_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One open shard's validated tables and tar bytes (buffers held while alive).",
    .tp_methods = Tables_methods,
    .tp_init = (initproc)Tables_init,
    .tp_new = PyType_GenericNew,
};

/* ---- gather: the scalar pass of ShardSet.gather ---------------------------------------- */

static int get_i64(PyObject *o, Py_buffer *b, const char *what, int flags) {
    if (PyObject_GetBuffer(o, b, flags) < 0) return -1;
    if (b->len % 8) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "%s: not an int64 buffer", what);
        return -1;
    }
    return 0;
}

/* gather(tables, slot, local) -> (keys, counts, offsets, sizes, ext_ids) | int
 * tables: tuple of Tables by slot; slot, local: int64 buffers of the batch. Returns the
 * batch's keys (list of str), member counts (int64 bytes) and its members' raw table bytes
 * in batch order; or the position of the first sample to hand back. */
static PyObject *k_gather(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "gather(tables: tuple, slot, local)");
        return NULL;
    }
    PyObject *tabs = args[0];
    Py_ssize_t nt = PyTuple_GET_SIZE(tabs);
    for (Py_ssize_t i = 0; i < nt; i++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(tabs, i), &TablesType)) {
            PyErr_SetString(PyExc_TypeError, "gather: tables must be Tables");
            return NULL;
        }
    Py_buffer bs, bl;
    if (get_i64(args[1], &bs, "slot", PyBUF_SIMPLE) < 0) return NULL;
    if (get_i64(args[2], &bl, "local", PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&bs);
        return NULL;
    }
    PyObject *res = NULL, *keys = NULL, *cnt = NULL, *ob = NULL, *sb = NULL, *eb = NULL;
    Py_ssize_t n = bs.len / 8, total = 0, bad = -1;
    const int64_t *slot = bs.buf, *local = bl.buf;
    if (bl.len != bs.len) {
        PyErr_SetString(PyExc_ValueError, "gather: slot and local differ in length");
        goto done;
    }
    /* pass 1: bounds, member total */
    for (Py_ssize_t b = 0; b < n; b++) {
        uint64_t k0, k1, m0, m1;
        if (slot[b] < 0 || slot[b] >= nt) {
            PyErr_SetString(PyExc_IndexError, "gather: slot out of range");
            goto done;
        }
        Tables *t = (Tables *)PyTuple_GET_ITEM(tabs, slot[b]);
        if (!tables_row(t, (Py_ssize_t)local[b], &k0, &k1, &m0, &m1)) {
            bad = b;
            break;
        }
        for (uint64_t m = m0; m < m1; m++)
            if (!member_ok(t, m, t->data.len)) {
                bad = b;
                break;
            }
        if (bad >= 0) break;
        total += (Py_ssize_t)(m1 - m0);
    }
    if (bad >= 0) {
        res = PyLong_FromSsize_t(bad);
        goto done;
    }
    keys = PyList_New(n);
    cnt = PyBytes_FromStringAndSize(NULL, n * 8);
    ob = PyBytes_FromStringAndSize(NULL, total * 8);
    sb = PyBytes_FromStringAndSize(NULL, total * 8);
    eb = PyBytes_FromStringAndSize(NULL, total * 4);
    if (!keys || !cnt || !ob || !sb || !eb) goto done;
    int64_t *c = (int64_t *)PyBytes_AS_STRING(cnt);
    char *po = PyBytes_AS_STRING(ob), *ps = PyBytes_AS_STRING(sb), *pe = PyBytes_AS_STRING(eb);
    for (Py_ssize_t b = 0; b < n; b++) {
        uint64_t k0, k1, m0, m1;
        Tables *t = (Tables *)PyTuple_GET_ITEM(tabs, slot[b]);
        tables_row(t, (Py_ssize_t)local[b], &k0, &k1, &m0, &m1);
        PyObject *k = PyUnicode_DecodeUTF8((const char *)t->keys.buf + t->kbase + k0,
                                           (Py_ssize_t)(k1 - k0), "surrogateescape");
        if (k == NULL) goto done;
        PyList_SET_ITEM(keys, b, k);
        size_t cm = (size_t)(m1 - m0);
        c[b] = (int64_t)cm;
        memcpy(po, (const uint64_t *)t->off.buf + m0, cm * 8);
        memcpy(ps, (const uint64_t *)t->size.buf + m0, cm * 8);
        memcpy(pe, (const uint32_t *)t->eid.buf + m0, cm * 4);
        po += cm * 8;
        ps += cm * 8;
        pe += cm * 4;
    }
    res = PyTuple_Pack(5, keys, cnt, ob, sb, eb);
done:
    Py_XDECREF(keys);
    Py_XDECREF(cnt);
    Py_XDECREF(ob);
    Py_XDECREF(sb);
    Py_XDECREF(eb);
    PyBuffer_Release(&bs);
    PyBuffer_Release(&bl);
    return res;
}

/* ---- pack: the copy pass of torch.collate.pack_blocks ---------------------------------- */

/* Strict decimal: optional ASCII whitespace, optional sign, 1-18 digits, whitespace. */
static int parse_decimal(const char *p, Py_ssize_t n, int64_t *out) {
    Py_ssize_t i = 0, digits = 0;
    int neg = 0;
    int64_t v = 0;
    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    while (i < n && p[i] >= '0' && p[i] <= '9' && digits < 18) {
        v = v * 10 + (p[i++] - '0');
        digits++;
    }
    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
    if (digits == 0 || i != n) return 0;
    *out = neg ? -v : v;
    return 1;
}

/* pack(out, datas, src, offset, size, dest, vals, start) -> int
 * For members k >= start: dest[k] >= 0 copies datas[src[k]][offset[k]:+size[k]] to
 * out[dest[k]:]; dest[k] < 0 parses it as a decimal integer into vals[k]. Returns -1 when
 * done, or the first k it hands back (a member that is not a plain decimal, or a bound). */
static PyObject *k_pack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pack(out, datas: tuple, src, offset, size, dest, vals, start)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[7]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    PyObject *datas = args[1];
    Py_ssize_t nd = PyTuple_GET_SIZE(datas), got = 0, held = 0, ret = -1;
    Py_buffer out, arr[5], *db = NULL;
    PyObject *res = NULL;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) return NULL;
    for (; got < 5; got++)
        if (get_i64(args[2 + got], &arr[got], "pack array", got == 4 ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) goto done;
    Py_ssize_t n = arr[0].len / 8;
    for (int i = 1; i < 5; i++)
        if (arr[i].len != arr[0].len) {
            PyErr_SetString(PyExc_ValueError, "pack: arrays differ in length");
            goto done;
        }
    db = PyMem_Calloc(nd ? nd : 1, sizeof(Py_buffer));
    if (db == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < nd; held++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(datas, held), &db[held], PyBUF_SIMPLE) < 0)
            goto done;
    const int64_t *src = arr[0].buf, *off = arr[1].buf, *sz = arr[2].buf, *dest = arr[3].buf;
    int64_t *vals = arr[4].buf;
    char *o = out.buf;
    for (Py_ssize_t k = start < 0 ? 0 : start; k < n; k++) {
        int64_t s = src[k], a = off[k], len = sz[k], d = dest[k];
        if (s < 0 || s >= nd || a < 0 || len < 0 || a > db[s].len || len > db[s].len - a) {
            ret = k;
            break;
        }
        const char *p = (const char *)db[s].buf + a;
        if (d < 0) {
            if (!parse_decimal(p, (Py_ssize_t)len, &vals[k])) {
                ret = k;
                break;
            }
        } else if (d > out.len || len > out.len - d) {
            ret = k;
            break;
        } else {
            memcpy(o + d, p, (size_t)len);
        }
    }
    res = PyLong_FromSsize_t(ret);
done:
    while (held > 0) PyBuffer_Release(&db[--held]);
    PyMem_Free(db);
    while (got > 0) PyBuffer_Release(&arr[--got]);
    PyBuffer_Release(&out);
    return res;
}

static PyMethodDef kernel_methods[] = {
    {"gather", (PyCFunction)(void (*)(void))k_gather, METH_FASTCALL,
     "gather(tables, slot, local): keys, counts and member table bytes of a batch, or the "
     "position of the first sample to hand back."},
    {"pack", (PyCFunction)(void (*)(void))k_pack, METH_FASTCALL,
     "pack(out, datas, src, offset, size, dest, vals, start): copy byte members, parse "
     "integer members; -1 when done, else the first member to hand back."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "tarindex._kernel",
    "The read kernel's per-sample loops, compiled (tarindex/reader.py holds the rules).", -1,
    kernel_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernel(void) {
    if (PyType_Ready(&TablesType) < 0) return NULL;
    PyObject *m = PyModule_Create(&kernel_module);
    if (m == NULL) return NULL;
    Py_INCREF(&TablesType);
    if (PyModule_AddObject(m, "Tables", (PyObject *)&TablesType) < 0) {
        Py_DECREF(&TablesType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
