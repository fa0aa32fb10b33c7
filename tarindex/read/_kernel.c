/* tarindex.read._kernel: the read kernel's per-sample loops, compiled (optional; see docs/READING.md).
 *
 * Every function here reads tables that tarindex/read/ (checks.py) has already validated chunk by
 * chunk (check_samples): the guards live there, once. These loops still bound every read
 * they make (a pointer past its table, a member past the tar, an extension id past the
 * extension list) and, instead of raising, hand the case back: they return a
 * tarindex.read.hot.HandBack (the one class, fetched at import), on which the caller acts
 * (ReaderPool.settle: open the shard, check the chunk) or takes the pure-Python path, which
 * raises the FormatError that names the index.
 * Tables are little-endian (FORMAT.md section 2); the module is only used on little-endian
 * hosts. Without this module (no compiler at install, or TARINDEX_PURE_PYTHON=1) the same
 * loops run in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_SHIFT 10 /* tarindex.read.checks.CHUNK_SHIFT */

/* A reader's hot tables, tarindex.read.hot.HotTables (a NamedTuple, so a tuple): the one
 * structure these loops read of a reader (its public attribute `hot`), by field position.
 * tests/test_kernel_compiled.py checks these positions against HotTables._fields. */
#define HOT_FIELDS 16
#define HOT_TABLES 15 /* a Tables, or None: hand back */

/* `hot` a HotTables whose tables are a Tables (else hand back) */
#define HOT_OK(hot)                                                                    \
    (PyTuple_Check(hot) && PyTuple_GET_SIZE(hot) == HOT_FIELDS &&                      \
     PyObject_TypeCheck(PyTuple_GET_ITEM(hot, HOT_TABLES), &TablesType))

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define PREFETCH(p) ((void)(p))
#endif


/* ---- the fault guard: a tar cut while mapped is an error, never SIGBUS ------------------
 *
 * Every copy (and integer parse) out of a tar's mapping runs inside guarded_copy or
 * guarded_parse: the calling thread's Guard names the source range and a sigsetjmp point.
 * A SIGBUS whose address lies in that range (a page past the end of a file cut since it was
 * mapped, or an I/O error under the mapping) jumps back there, and the copy reports the
 * byte it faulted at; the caller then raises the Mapped's error (tarindex.read.checks.
 * tar_fault: TruncatedError naming the file and offset). Nothing but memcpy or the parse
 * runs between the sigsetjmp and the jump (no allocation, no Python), so jumping out is
 * sound. Any other SIGBUS goes to the handler that was there before (faulthandler's, or the
 * default: the process dies as it would have). The handler is installed at import and put
 * back in front whenever a Mapped is made, if someone (faulthandler.enable()) replaced it. */
typedef struct {
    sigjmp_buf jb;
    const char *lo, *hi;     /* the guarded source range */
    const char *volatile at; /* where it faulted */
} Guard;

static __thread Guard *volatile cur_guard __attribute__((tls_model("initial-exec")));
static struct sigaction prev_bus; /* the handler ours replaced: called for faults not ours */

static void on_bus(int sig, siginfo_t *info, void *ctx) {
    Guard *g = cur_guard;
    const char *a = info != NULL ? (const char *)info->si_addr : NULL;
    if (g != NULL && info != NULL && info->si_code > 0 && a >= g->lo && a < g->hi) {
        g->at = a;
        cur_guard = NULL;
        siglongjmp(g->jb, 1);
    }
    void (*h)(int) = prev_bus.sa_handler;
    if (h == SIG_DFL || h == SIG_IGN) { /* die as before: the fault recurs on return */
        struct sigaction d;
        memset(&d, 0, sizeof d);
        d.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &d, NULL);
        return;
    }
    if (prev_bus.sa_flags & SA_SIGINFO)
        prev_bus.sa_sigaction(sig, info, ctx);
    else
        h(sig);
}

/* Put on_bus in front of the SIGBUS handler (once, or again if another replaced it). */
static void guard_install(void) {
    struct sigaction now, ours;
    if (sigaction(SIGBUS, NULL, &now) < 0) return;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_bus) return;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_bus;
    sigemptyset(&ours.sa_mask);
    /* SA_NODEFER: sigsetjmp(, 0) does not restore the mask, so SIGBUS must not stay blocked
     * after the jump; SA_ONSTACK: a fault with the stack exhausted still reaches us */
    ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    if (sigaction(SIGBUS, &ours, &prev_bus) < 0) return;
}

#define BARRIER() __asm__ __volatile__("" ::: "memory")

/* memcpy(dst, src, n); -1 with *at the faulting source address if the mapping faulted. */
static __attribute__((noinline)) int guarded_copy(char *dst, const char *src, size_t n,
                                                  const char **at) {
    Guard g;
    if (n == 0) return 0;
    g.lo = src;
    g.hi = src + n;
    g.at = NULL;
    if (sigsetjmp(g.jb, 0)) {
        *at = g.at;
        return -1;
    }
    cur_guard = &g;
    BARRIER();
    memcpy(dst, src, n);
    BARRIER();
    cur_guard = NULL;
    return 0;
}

static int parse_decimal(const char *p, Py_ssize_t n, int64_t *out);

/* parse_decimal over a mapping: 1, 0 (not a decimal) or -1 (*at: it faulted there). */
static __attribute__((noinline)) int guarded_parse(const char *p, Py_ssize_t n, int64_t *out,
                                                   const char **at) {
    Guard g;
    volatile int ok = 0;
    g.lo = p;
    g.hi = p + n;
    g.at = NULL;
    if (sigsetjmp(g.jb, 0)) {
        *at = g.at;
        return -1;
    }
    cur_guard = &g;
    BARRIER();
    ok = parse_decimal(p, n, out);
    BARRIER();
    cur_guard = NULL;
    return ok;
}

/* ---- Mapped: a tar's mapping, its descriptor and what it was when opened ----------------- */

typedef struct {
    PyObject_HEAD
    char *base;      /* the mapping of the tar's `size` bytes (NULL: none, size 0) */
    int fd;          /* owned: closed with the object (the mapping's and the check's) */
    long long size, dev, ino, mtime_ns; /* the tar when opened (fstat; mtime < 0: not compared) */
    PyObject *fault; /* fault(at) -> the error to raise (tarindex.read.checks.tar_fault) */
} Mapped;

static PyTypeObject MappedType;

/* Raise m's error for a fault at byte `at` of the tar (-1: a change seen by check). */
static void mapped_raise(PyObject *obj, Py_ssize_t at) {
    Mapped *m = (obj != NULL && PyObject_TypeCheck(obj, &MappedType)) ? (Mapped *)obj : NULL;
    PyObject *e = m != NULL && m->fault != NULL ? PyObject_CallFunction(m->fault, "n", at) : NULL;
    if (m != NULL && m->fault != NULL && e == NULL) return; /* fault() raised: that error */
    if (e != NULL && PyExceptionInstance_Check(e)) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
    } else {
        PyErr_Format(PyExc_OSError, "byte %zd: reading a mapped tar faulted (SIGBUS)", at);
    }
    Py_XDECREF(e);
}

/* 0 if the tar is as it was when opened (size, device, inode, mtime: one fstat), else -1
 * with m's error set (TruncatedError if cut, StaleIndexError if changed): the C side of
 * tarindex.read.checks.tar_fault. */
static int mapped_check(Mapped *m) {
    struct stat st;
    if (fstat(m->fd, &st) == 0 && (long long)st.st_size == m->size &&
        (long long)st.st_dev == m->dev && (long long)st.st_ino == m->ino &&
        (m->mtime_ns < 0 ||
         (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec == m->mtime_ns))
        return 0;
    mapped_raise((PyObject *)m, -1);
    if (!PyErr_Occurred()) /* fault() saw nothing wrong: a race with a change back */
        return 0;
    return -1;
}

static void Mapped_dealloc(Mapped *m) {
    if (m->base != NULL) munmap(m->base, (size_t)m->size);
    if (m->fd >= 0) close(m->fd);
    Py_CLEAR(m->fault);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *Mapped_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Mapped *m = (Mapped *)type->tp_alloc(type, 0);
    if (m != NULL) m->fd = -1;
    return (PyObject *)m;
}

/* Mapped(fd, size, dev, ino, mtime_ns, fault): maps `size` bytes of fd read-only; fd is
 * owned once this returns without an error (the caller closes it otherwise). */
static int Mapped_init(Mapped *m, PyObject *args, PyObject *kw) {
    static char *names[] = {"fd", "size", "dev", "ino", "mtime_ns", "fault", NULL};
    PyObject *fault;
    int fd;
    long long size, dev, ino, mtime;
    if (m->fd >= 0) {
        PyErr_SetString(PyExc_TypeError, "Mapped is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iLLLLO:Mapped", names, &fd, &size, &dev, &ino,
                                     &mtime, &fault))
        return -1;
    if (size < 0 || (unsigned long long)size > (unsigned long long)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_ValueError, "Mapped: size out of range");
        return -1;
    }
    if (size > 0) {
        void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        m->base = p;
    }
    m->fd = fd; /* owned from here on */
    m->size = size;
    m->dev = dev;
    m->ino = ino;
    m->mtime_ns = mtime;
    Py_INCREF(fault);
    m->fault = fault;
    guard_install();
    return 0;
}

/* The buffer of the mapping, read-only: for the loops of this module (which copy out of it
 * guarded), never for Python code (which slices, guarded). */
static int Mapped_getbuffer(Mapped *m, Py_buffer *view, int flags) {
    if (m->fd < 0) {
        PyErr_SetString(PyExc_BufferError, "Mapped is not initialised");
        return -1;
    }
    static char empty[1];
    return PyBuffer_FillInfo(view, (PyObject *)m, m->base != NULL ? m->base : empty,
                             (Py_ssize_t)m->size, 1, flags);
}

static PyBufferProcs Mapped_as_buffer = {(getbufferproc)Mapped_getbuffer, NULL};

static Py_ssize_t Mapped_len(Mapped *m) { return m->base != NULL ? (Py_ssize_t)m->size : 0; }

/* m[a:b]: a copy of those bytes (clamped as bytes slicing is); the fault guard around it. */
static PyObject *Mapped_subscript(Mapped *m, PyObject *item) {
    Py_ssize_t a, b, step;
    if (!PySlice_Check(item)) {
        PyErr_SetString(PyExc_TypeError, "Mapped indices must be slices");
        return NULL;
    }
    if (PySlice_Unpack(item, &a, &b, &step) < 0) return NULL;
    Py_ssize_t n = PySlice_AdjustIndices(Mapped_len(m), &a, &b, step);
    if (step != 1) {
        PyErr_SetString(PyExc_ValueError, "Mapped slices have step 1");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    const char *at = NULL, *src = (const char *)m->base + a;
    if (out == NULL) return NULL;
    if (guarded_copy(PyBytes_AS_STRING(out), src, (size_t)n, &at) < 0) {
        Py_DECREF(out);
        mapped_raise((PyObject *)m, a + (at - src));
        return NULL;
    }
    return out;
}

static PyMappingMethods Mapped_as_mapping = {(lenfunc)Mapped_len, (binaryfunc)Mapped_subscript,
                                             NULL};

static PyObject *Mapped_check(Mapped *m, PyObject *unused) {
    if (mapped_check(m) < 0) return NULL;
    Py_RETURN_NONE;
}

/* willneed(start, end): madvise(MADV_WILLNEED) over those bytes (a read-ahead hint). */
static PyObject *Mapped_willneed(Mapped *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "willneed(start, end)");
        return NULL;
    }
    Py_ssize_t a = PyLong_AsSsize_t(args[0]), b;
    if (a == -1 && PyErr_Occurred()) return NULL;
    b = PyLong_AsSsize_t(args[1]);
    if (b == -1 && PyErr_Occurred()) return NULL;
    if (a < 0) a = 0;
    if (b > Mapped_len(m)) b = Mapped_len(m);
    if (m->base != NULL && b > a) {
        long page = sysconf(_SC_PAGESIZE);
        Py_ssize_t p0 = a - a % (page > 0 ? page : 4096);
        (void)madvise(m->base + p0, (size_t)(b - p0), MADV_WILLNEED); /* a hint: no error */
    }
    Py_RETURN_NONE;
}

static PyMethodDef Mapped_methods[] = {
    {"willneed", (PyCFunction)(void (*)(void))Mapped_willneed, METH_FASTCALL,
     "willneed(start, end): ask the kernel to read those bytes ahead (madvise)."},
    {"check", (PyCFunction)Mapped_check, METH_NOARGS,
     "check(): raise the error of a tar changed since it was opened (size, device, inode, "
     "mtime; one fstat)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject MappedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarindex.read._kernel.Mapped",
    .tp_basicsize = sizeof(Mapped),
    .tp_dealloc = (destructor)Mapped_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A tar's mapping and descriptor (owned), read with the fault guard.",
    .tp_methods = Mapped_methods,
    .tp_init = (initproc)Mapped_init,
    .tp_new = Mapped_new,
    .tp_as_buffer = &Mapped_as_buffer,
    .tp_as_mapping = &Mapped_as_mapping,
};

/* ---- Tables: one open shard's tables and tar bytes, pinned while the object lives ------ */

static uint64_t kernel_calls = 0; /* numbers the calls that check each mapping's size once */
static PyObject *str_hot, *str_open, *str_check, *str_python, *str_key, *str_shard,
    *str_index;
static PyObject *HandBackType; /* tarindex.read.hot.HandBack, fetched at import */

/* A hand-back: HandBack(why, shard, chunk, at), a new reference (NULL with an error).
 * ("open", shard, -1, at), ("check", shard, chunk, at) or ("python", -1, -1, at). */
static PyObject *hand_back(PyObject *why, Py_ssize_t s, Py_ssize_t c, Py_ssize_t at) {
    return PyObject_CallFunction(HandBackType, "Onnn", why, s, c, at);
}

static PyObject *python_at(Py_ssize_t at) { return hand_back(str_python, -1, -1, at); }

typedef struct {
    PyObject_HEAD
    Py_buffer kp, sp, keys, eid, off, size, data, checked;
    int nbuf;            /* how many of the buffers above are held (released in reverse) */
    Py_ssize_t n;        /* samples */
    Py_ssize_t members;  /* entries of eid/off/size */
    Py_ssize_t kbase;    /* where the key blob starts in `keys` */
    Py_ssize_t kend;     /* where it ends */
    PyObject *exts;      /* tuple of str: extension names by id */
    PyObject *mapped;    /* `data` when it is a Mapped (its check and fault), else NULL */
    Py_ssize_t n_exts;
    uint64_t mark;       /* the batch() call that last checked this mapping's size */
} Tables;

static Py_buffer *tables_buf(Tables *t, int i) {
    Py_buffer *all[] = {&t->kp, &t->sp, &t->keys, &t->eid, &t->off, &t->size, &t->data, &t->checked};
    return all[i];
}

/* Release what init took: no buffers, no samples (every read then hands back). */
static void tables_clear(Tables *t) {
    while (t->nbuf > 0) PyBuffer_Release(tables_buf(t, --t->nbuf));
    Py_CLEAR(t->exts);
    Py_CLEAR(t->mapped);
    t->n = t->members = t->kbase = t->kend = t->n_exts = 0;
}

static void Tables_dealloc(Tables *t) {
    tables_clear(t);
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
        goto fail;
    int order[] = {0, 1, 2, 5, 6, 7, 8, 10};
    for (int i = 0; i < 8; i++) {
        int flags = i == 7 ? PyBUF_WRITABLE : PyBUF_SIMPLE;
        if (PyObject_GetBuffer(obj[order[i]], tables_buf(t, i), flags) < 0) goto fail;
        t->nbuf = i + 1;
    }
    if (t->kp.len % 8 || t->sp.len % 8 || t->off.len % 8 || t->size.len % 8 || t->eid.len % 4 ||
        t->kp.len < 8 || t->kp.len != t->sp.len || t->off.len != t->size.len ||
        t->off.len / 8 != t->eid.len / 4 || t->kbase < 0 || t->kend < t->kbase ||
        t->kend > t->keys.len) {
        PyErr_SetString(PyExc_ValueError, "Tables: inconsistent table lengths");
        goto fail;
    }
    t->n = t->kp.len / 8 - 1;
    t->members = t->eid.len / 4;
    if (t->checked.len < ((t->n + (1 << CHUNK_SHIFT) - 1) >> CHUNK_SHIFT)) {
        PyErr_SetString(PyExc_ValueError, "Tables: chunk flags shorter than the sample count");
        goto fail;
    }
    Py_INCREF(obj[9]);
    t->exts = obj[9];
    if (PyObject_TypeCheck(obj[8], &MappedType)) t->mapped = Py_NewRef(obj[8]);
    t->n_exts = PyTuple_GET_SIZE(obj[9]);
    return 0;
fail: /* a half-set object would read past what it holds (sample() after a caught error) */
    tables_clear(t);
    return -1;
}

/* The cut and change check of t's tar (Mapped.check): 0, or -1 with the error set. */
static int tables_check(Tables *t) {
    return t->mapped == NULL ? 0 : mapped_check((Mapped *)t->mapped);
}

/* bytes of s bytes at offset o of t's tar, copied with the fault guard; NULL with the
 * error set (the Mapped's, naming the byte it faulted at). */
static PyObject *tables_bytes(Tables *t, uint64_t o, uint64_t s) {
    PyObject *v = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)s);
    const char *at = NULL, *src = (const char *)t->data.buf + o;
    if (v == NULL) return NULL;
    if (guarded_copy(PyBytes_AS_STRING(v), src, (size_t)s, &at) < 0) {
        Py_DECREF(v);
        mapped_raise(t->mapped, (Py_ssize_t)o + (at - src));
        return NULL;
    }
    return v;
}

/* Sample j's key and member run, bounded; 0 = hand back (unchecked chunk or out of bounds). */
static int tables_row(Tables *t, Py_ssize_t j, uint64_t *k0, uint64_t *k1, uint64_t *m0,
                      uint64_t *m1) {
    const uint64_t *kp = t->kp.buf, *sp = t->sp.buf;
    if (j < 0 || j >= t->n || !((const char *)t->checked.buf)[j >> CHUNK_SHIFT]) return 0;
    *k0 = ((const volatile uint64_t *)kp)[j]; /* each read once: see member_get */
    *k1 = ((const volatile uint64_t *)kp)[j + 1];
    *m0 = ((const volatile uint64_t *)sp)[j];
    *m1 = ((const volatile uint64_t *)sp)[j + 1];
    return *k0 <= *k1 && *k1 <= (uint64_t)(t->kend - t->kbase) && *m0 <= *m1 &&
           *m1 <= (uint64_t)t->members;
}

/* Member m's extension id, offset and size, each read once and bounded (0 = hand back).
 * Callers use these copies, never the tables again: a table may change under a read (a
 * writable buffer changed by Python code the loop runs, an index file rewritten in place). */
static int member_get(Tables *t, uint64_t m, uint32_t *e, uint64_t *o, uint64_t *s) {
    *e = ((const volatile uint32_t *)t->eid.buf)[m];
    *o = ((const volatile uint64_t *)t->off.buf)[m];
    *s = ((const volatile uint64_t *)t->size.buf)[m];
    return *e < (uint64_t)t->n_exts && *o <= (uint64_t)t->data.len &&
           *s <= (uint64_t)t->data.len - *o;
}

static int member_ok(Tables *t, uint64_t m) {
    uint32_t e;
    uint64_t o, s;
    return member_get(t, m, &e, &o, &s);
}

/* Sample j as {"__key__", ext: bytes..., "__shard__", "__index__"} (ShardSet.get's order), or
 * with meta_first {"__key__", "__shard__", "__index__", ext: bytes...} (Block.to_samples'):
 * a new reference; Py_None (new reference: hand back, an unchecked chunk or a bound that does
 * not hold) or NULL with an exception. want: NULL (every member) or want[ext_id] != 0 for the
 * extensions to read. The caller has checked that the mapping still covers the tar. */
static PyObject *tables_dict(Tables *t, Py_ssize_t j, const char *want, PyObject *shard,
                             PyObject *index, int meta_first) {
    uint64_t k0 = 0, k1 = 0, m0 = 0, m1 = 0;
    if (!tables_row(t, j, &k0, &k1, &m0, &m1)) Py_RETURN_NONE;
    for (uint64_t m = m0; m < m1; m++)
        if (!member_ok(t, m)) Py_RETURN_NONE;
    PyObject *d = PyDict_New(), *v;
    if (d == NULL) return NULL;
    v = PyUnicode_DecodeUTF8((const char *)t->keys.buf + t->kbase + k0, (Py_ssize_t)(k1 - k0),
                             "surrogateescape");
    if (v == NULL || PyDict_SetItem(d, str_key, v) < 0) goto fail;
    Py_DECREF(v);
    v = NULL;
    if (meta_first &&
        (PyDict_SetItem(d, str_shard, shard) < 0 || PyDict_SetItem(d, str_index, index) < 0))
        goto fail;
    for (uint64_t m = m0; m < m1; m++) { /* PyDict_New and hashing may have run Python code */
        uint32_t e;
        uint64_t o, s;
        if (!member_get(t, m, &e, &o, &s)) { /* changed since the check above */
            Py_DECREF(d);
            Py_RETURN_NONE;
        }
        if (want != NULL && !want[e]) continue;
        v = tables_bytes(t, o, s);
        if (v == NULL || PyDict_SetItem(d, PyTuple_GET_ITEM(t->exts, e), v) < 0) goto fail;
        Py_DECREF(v);
    }
    v = NULL;
    if (!meta_first &&
        (PyDict_SetItem(d, str_shard, shard) < 0 || PyDict_SetItem(d, str_index, index) < 0))
        goto fail;
    return d;
fail:
    Py_XDECREF(v);
    Py_DECREF(d);
    return NULL;
}

/* Prefetch, a few samples or a pass ahead of the reads (batch, take: samples in random or
 * shuffled order are a cache miss each otherwise): sample j's table rows; its key and member
 * entries (reads its row); the first `bytes` bytes of each of its members (reads the
 * entries). Bounded as tables_dict reads; no effect on results. */
static void prefetch_row(Tables *t, Py_ssize_t j) {
    if (j < 0 || j >= t->n) return;
    PREFETCH((const uint64_t *)t->kp.buf + j);
    PREFETCH((const uint64_t *)t->sp.buf + j);
}

static void prefetch_members(Tables *t, Py_ssize_t j) {
    uint64_t k0, k1, m0, m1;
    if (!tables_row(t, j, &k0, &k1, &m0, &m1)) return;
    PREFETCH((const char *)t->keys.buf + t->kbase + k0);
    for (uint64_t m = m0; m < m1 && m < m0 + 8; m++) {
        PREFETCH((const uint64_t *)t->off.buf + m);
        PREFETCH((const uint64_t *)t->size.buf + m);
        PREFETCH((const uint32_t *)t->eid.buf + m);
    }
}

static void prefetch_data(Tables *t, Py_ssize_t j, uint64_t bytes) {
    uint64_t k0, k1, m0, m1;
    if (!tables_row(t, j, &k0, &k1, &m0, &m1)) return;
    for (uint64_t m = m0; m < m1; m++) {
        uint32_t e;
        uint64_t o, s;
        if (!member_get(t, m, &e, &o, &s)) return;
        const char *p = (const char *)t->data.buf + o;
        for (uint64_t at = 0; at < s && at < bytes; at += 64) PREFETCH(p + at);
    }
}

/* want: None (NULL: every member) or bytes of one flag per extension; -1 with TypeError. */
static int get_want(Tables *t, PyObject *obj, const char **want) {
    *want = NULL;
    if (obj == Py_None) return 0;
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) < t->n_exts) {
        PyErr_SetString(PyExc_TypeError, "want: bytes of one flag per extension");
        return -1;
    }
    *want = PyBytes_AS_STRING(obj);
    return 0;
}

/* samples(j0, j1, want, shard, base) -> [dict, ...] | HandBack: tables_dict of each sample
 * j0 <= j < j1 in Block.to_samples' order, "__index__" base + j - j0 (a streaming block,
 * ShardSet.read_samples); a "python" HandBack at j - j0 if sample j hands back, at 0 for a
 * range it refuses (the Python path then reads the block or raises). */
static PyObject *Tables_samples(Tables *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "samples(j0, j1, want, shard, base)");
        return NULL;
    }
    Py_ssize_t j0 = PyLong_AsSsize_t(args[0]), j1, base;
    if (j0 == -1 && PyErr_Occurred()) return NULL;
    j1 = PyLong_AsSsize_t(args[1]);
    if (j1 == -1 && PyErr_Occurred()) return NULL;
    base = PyLong_AsSsize_t(args[4]);
    if (base == -1 && PyErr_Occurred()) return NULL;
    const char *want;
    if (get_want(t, args[2], &want) < 0) return NULL;
    if (j0 < 0 || j1 < j0 || j1 > t->n || base > PY_SSIZE_T_MAX - (j1 - j0)) return python_at(0);
    PyObject *out = PyList_New(j1 - j0);
    if (out == NULL) return NULL;
    /* its slots are NULL until filled and tables_dict runs Python code (a hash), which could
     * reach a tracked list through gc.get_objects(): tracked again once full */
    PyObject_GC_UnTrack(out);
    for (Py_ssize_t j = j0; j < j1; j++) {
        PyObject *index = PyLong_FromSsize_t(base + (j - j0)), *d;
        if (index == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        d = tables_dict(t, j, want, args[3], index, 1);
        Py_DECREF(index);
        if (d == NULL || d == Py_None) {
            Py_DECREF(out);
            if (d == NULL) return NULL;
            Py_DECREF(d);
            return python_at(j - j0);
        }
        PyList_SET_ITEM(out, j - j0, d);
    }
    PyObject_GC_Track(out);
    return out;
}

static PyMethodDef Tables_methods[] = {
    {"samples", (PyCFunction)(void (*)(void))Tables_samples, METH_FASTCALL,
     "samples(j0, j1, want, shard, base): samples j0..j1 as dicts, or a HandBack (take the "
     "Python path)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject TablesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarindex.read._kernel.Tables",
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

/* gather(tables, shards, slot, local) -> (keys, counts, offsets, sizes, ext_ids) | HandBack
 * tables: tuple of Tables by slot; shards: tuple of the shard number of each (named by a
 * "check" hand-back); slot, local: int64 buffers of the batch. Returns the batch's keys (list
 * of str), member counts (int64 bytes) and its members' raw table bytes in batch order; or a
 * HandBack at the first sample it does not read: "check" (its chunk is unchecked), else
 * "python". */
static PyObject *k_gather(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "gather(tables: tuple, shards: tuple, slot, local)");
        return NULL;
    }
    PyObject *tabs = args[0], *shards = args[1];
    Py_ssize_t nt = PyTuple_GET_SIZE(tabs);
    for (Py_ssize_t i = 0; i < nt; i++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(tabs, i), &TablesType)) {
            PyErr_SetString(PyExc_TypeError, "gather: tables must be Tables");
            return NULL;
        }
    if (PyTuple_GET_SIZE(shards) != nt) {
        PyErr_SetString(PyExc_ValueError, "gather: tables and shards differ in length");
        return NULL;
    }
    Py_buffer bs, bl;
    if (get_i64(args[2], &bs, "slot", PyBUF_SIMPLE) < 0) return NULL;
    if (get_i64(args[3], &bl, "local", PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&bs);
        return NULL;
    }
    PyObject *res = NULL, *keys = NULL, *cnt = NULL, *ob = NULL, *sb = NULL, *eb = NULL;
    Py_ssize_t n = bs.len / 8, total = 0, bad = -1, bad_chunk = -1, bad_slot = 0;
    const int64_t *slot = bs.buf, *local = bl.buf;
    if (bl.len != bs.len) {
        PyErr_SetString(PyExc_ValueError, "gather: slot and local differ in length");
        goto done;
    }
    /* pass 1: bounds, member total */
    for (Py_ssize_t b = 0; b < n; b++) {
        uint64_t k0 = 0, k1 = 0, m0 = 0, m1 = 0;
        if (slot[b] < 0 || slot[b] >= nt) {
            PyErr_SetString(PyExc_IndexError, "gather: slot out of range");
            goto done;
        }
        Tables *t = (Tables *)PyTuple_GET_ITEM(tabs, slot[b]);
        Py_ssize_t j = (Py_ssize_t)local[b];
        if (!tables_row(t, j, &k0, &k1, &m0, &m1)) {
            bad = b;
            if (j >= 0 && j < t->n && !((const char *)t->checked.buf)[j >> CHUNK_SHIFT]) {
                bad_chunk = j >> CHUNK_SHIFT;
                bad_slot = (Py_ssize_t)slot[b];
            }
            break;
        }
        for (uint64_t m = m0; m < m1; m++)
            if (!member_ok(t, m)) {
                bad = b;
                break;
            }
        if (bad >= 0) break;
        total += (Py_ssize_t)(m1 - m0);
    }
    if (bad >= 0) {
        if (bad_chunk < 0) {
            res = python_at(bad);
            goto done;
        }
        Py_ssize_t sh = PyLong_AsSsize_t(PyTuple_GET_ITEM(shards, bad_slot));
        if (sh == -1 && PyErr_Occurred()) goto done;
        res = hand_back(str_check, sh, bad_chunk, bad);
        goto done;
    }
    keys = PyList_New(n);
    cnt = PyBytes_FromStringAndSize(NULL, n * 8);
    ob = PyBytes_FromStringAndSize(NULL, total * 8);
    sb = PyBytes_FromStringAndSize(NULL, total * 8);
    eb = PyBytes_FromStringAndSize(NULL, total * 4);
    if (!keys || !cnt || !ob || !sb || !eb) goto done;
    PyObject_GC_UnTrack(keys); /* NULL slots until filled: see Tables_samples */
    int64_t *c = (int64_t *)PyBytes_AS_STRING(cnt);
    char *po = PyBytes_AS_STRING(ob), *ps = PyBytes_AS_STRING(sb), *pe = PyBytes_AS_STRING(eb);
    Py_ssize_t left = total;
    for (Py_ssize_t b = 0; b < n; b++) {
        uint64_t k0 = 0, k1 = 0, m0 = 0, m1 = 0;
        /* the allocations above may run Python code (a collection's finalizers): the slot,
         * the row and its member count are read and bounded again */
        int64_t sl = ((const volatile int64_t *)slot)[b];
        if (sl < 0 || sl >= nt) {
            res = python_at(b);
            goto done;
        }
        Tables *t = (Tables *)PyTuple_GET_ITEM(tabs, sl);
        if (!tables_row(t, (Py_ssize_t)((const volatile int64_t *)local)[b], &k0, &k1, &m0, &m1) ||
            m1 - m0 > (uint64_t)left) {
            res = python_at(b);
            goto done;
        }
        left -= (Py_ssize_t)(m1 - m0);
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
    PyObject_GC_Track(keys);
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

/* pack(out, datas, src, offset, size, dest, vals, start) -> None | HandBack
 * For members k >= start: dest[k] >= 0 copies datas[src[k]][offset[k]:+size[k]] to
 * out[dest[k]:]; dest[k] < 0 parses it as a decimal integer into vals[k]. Returns None when
 * done, or a "python" HandBack at the first k it leaves to Python (a member that is not a
 * plain decimal, or a bound). */
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
        const char *p = (const char *)db[s].buf + a, *at = NULL;
        int okc = 1;
        if (d < 0) {
            okc = guarded_parse(p, (Py_ssize_t)len, &vals[k], &at);
            if (okc == 0) {
                ret = k;
                break;
            }
        } else if (d > out.len || len > out.len - d) {
            ret = k;
            break;
        } else {
            okc = guarded_copy(o + d, p, (size_t)len, &at);
        }
        if (okc < 0) { /* a mapped tar cut under the copy: its error */
            mapped_raise(PyTuple_GET_ITEM(datas, s), (Py_ssize_t)a + (at - p));
            goto done;
        }
    }
    res = ret < 0 ? Py_NewRef(Py_None) : python_at(ret);
done:
    while (held > 0) PyBuffer_Release(&db[--held]);
    PyMem_Free(db);
    while (got > 0) PyBuffer_Release(&arr[--got]);
    PyBuffer_Release(&out);
    return res;
}

/* The shard holding global sample i, 0 <= i < starts[ns]: i // per when every shard but the
 * last holds `per` samples (per > 0), else the last shard whose start is <= i. The caller
 * checks starts[sh] <= i < starts[sh + 1] (a hostile `per` or `starts` can break it). */
static Py_ssize_t shard_of(const int64_t *starts, Py_ssize_t ns, Py_ssize_t per, Py_ssize_t i) {
    if (per > 0) {
        Py_ssize_t sh = i / per;
        return sh > ns - 1 ? ns - 1 : sh;
    }
    Py_ssize_t lo = 0, hi = ns;
    while (hi - lo > 1) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (starts[mid] <= i) lo = mid; else hi = mid;
    }
    return lo;
}

/* ---- batch: ShardSet.gather + pack_blocks in two passes -------------------------------- */


/* Layout position of extension `name` in this call: >= 0 a byte field, <= -2 integer field
 * -2 - p, -1 left out. `pos` caches it by name; new fields are numbered by first
 * appearance. Returns POS_ERROR with an exception set. */
#define POS_ERROR PY_SSIZE_T_MIN
static Py_ssize_t field_pos(PyObject *pos, PyObject *name, PyObject *fields, PyObject *ints,
                            PyObject *bnames, PyObject *inames) {
    PyObject *got = PyDict_GetItemWithError(pos, name);
    if (got != NULL) return PyLong_AsSsize_t(got);
    if (PyErr_Occurred()) return POS_ERROR;
    Py_ssize_t p = -1;
    int want = fields == Py_None ? 1 : PySequence_Contains(fields, name);
    if (want < 0) return POS_ERROR;
    if (want) {
        int is_int = PySequence_Contains(ints, name);
        if (is_int < 0) return POS_ERROR;
        PyObject *list = is_int ? inames : bnames;
        p = is_int ? -2 - PyList_GET_SIZE(list) : PyList_GET_SIZE(list);
        if (PyList_Append(list, name) < 0) return POS_ERROR;
    }
    PyObject *v = PyLong_FromSsize_t(p);
    if (v == NULL || PyDict_SetItem(pos, name, v) < 0) {
        Py_XDECREF(v);
        return POS_ERROR;
    }
    Py_DECREF(v);
    return p;
}

/* batch(indices, starts, per, readers, paths, fields, int_fields, alloc)
 *     -> (keep, keys, byte_fields, int_fields, offsets, present, ints, index, shards)
 *        | HandBack
 * ShardSet.gather_packed's loops. indices: global sample indices (ints); starts: int64
 * (n_shards + 1) first global index of each shard; per: samples per shard when all but the
 * last hold that many, else 0; readers: the pool's readers (shard -> ShardReader, whose `hot`
 * is a HotTables: its Tables, mapping and tar size); paths: shard paths; fields: None or the extensions
 * to read; int_fields: extensions parsed as decimal integers; alloc(nbytes) -> (keep,
 * writable buffer). Pass 1 bounds every read, checks each shard's mapping still covers its
 * tar (mmap.size()), decodes keys, parses integer members and sizes the field-major layout
 * (torch/batch.py field_major); pass 2 copies, each read bounded again. offsets int64 (nf, n + 1), present uint8
 * (nf, n), ints int64 (ni, n) (-1 where missing) and index int64 (n) come back as
 * bytearrays. A HandBack instead, at the position in indices the loop stopped at: "open"
 * (the shard has no open reader), "check" (its chunk's tables are unchecked), "python"
 * (anything else: an index out of range or not an
 * int (exactly: a bool or a numpy integer is handed back too), a cut tar, a bound, an extension twice, an integer member that is not a plain
 * decimal: the Python path raises the error or returns the batch). */
static PyObject *k_batch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyDict_Check(args[3]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "batch(indices, starts, per, readers: dict, paths: list, fields, "
                        "int_fields, alloc)");
        return NULL;
    }
    PyObject *readers = args[3], *paths = args[4], *fields = args[5], *intf = args[6],
             *alloc = args[7];
    Py_ssize_t per = PyLong_AsSsize_t(args[2]);
    if (per == -1 && PyErr_Occurred()) return NULL;
    Py_buffer bst, out;
    int have_out = 0;
    if (get_i64(args[1], &bst, "starts", PyBUF_SIMPLE) < 0) return NULL;
    /* a snapshot: an item's __index__ may change the caller's list while we walk it */
    PyObject *seq = PySequence_Tuple(args[0]);
    if (seq == NULL) {
        PyBuffer_Release(&bst);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq), ns = bst.len / 8 - 1;
    const int64_t *starts = bst.buf;
    PyObject *res = NULL, *keys = NULL, *bnames = NULL, *inames = NULL, *offs = NULL,
             *pres = NULL, *ints = NULL, *index = NULL, *shards = NULL, *made = NULL,
             *pos = NULL;
    Tables **row_t = NULL;
    int64_t *row_j = NULL, *row_s = NULL, *lens = NULL, *ivals = NULL;
    Py_ssize_t nf = 0, ni = 0, cap = 8, nrow = 0;
    uint64_t call = ++kernel_calls;
    if (ns < 1 || n == 0) {
        res = python_at(0);
        goto done;
    }
    row_t = PyMem_Malloc(n * sizeof(Tables *));
    row_j = PyMem_Malloc(n * sizeof(int64_t));
    row_s = PyMem_Malloc(n * sizeof(int64_t));
    lens = PyMem_Malloc(cap * n * sizeof(int64_t));
    ivals = PyMem_Malloc(cap * n * sizeof(int64_t));
    keys = PyList_New(n);
    bnames = PyList_New(0);
    inames = PyList_New(0);
    pos = PyDict_New();
    index = PyByteArray_FromStringAndSize(NULL, n * 8);
    shards = PyList_New(n);
    if (!row_t || !row_j || !row_s || !lens || !ivals) {
        PyErr_NoMemory();
        goto done;
    }
    if (!keys || !bnames || !inames || !pos || !index || !shards) goto done;
    /* NULL slots until filled, while Python code runs (hot, size(), hashes, alloc): a
     * tracked list would be reachable through gc.get_objects() (see Tables_samples) */
    PyObject_GC_UnTrack(keys);
    PyObject_GC_UnTrack(shards);
    int64_t *idx = (int64_t *)PyByteArray_AS_STRING(index), total = starts[ns];
    /* pass 1: locate, look up, cut check; then (prefetched) keys, members, layout sizes */
    for (Py_ssize_t b = 0; b < n; b++) {
        /* only an int (take's and sample's rule too): a bool, a numpy integer, anything else
         * goes back to the caller, which applies the index rule (spanner.check_indices) */
        PyObject *io = PyTuple_GET_ITEM(seq, b);
        Py_ssize_t i = PyLong_CheckExact(io) ? PyLong_AsSsize_t(io) : -1;
        if (i == -1 && (!PyLong_CheckExact(io) || PyErr_Occurred())) {
            PyErr_Clear(); /* not an int, or past Py_ssize_t: the Python path says so */
            res = python_at(b);
            goto done;
        }
        if (i < 0) i += total;
        if (i < 0 || i >= total) {
            res = python_at(b);
            goto done;
        }
        Py_ssize_t sh = shard_of(starts, ns, per, i);
        int64_t s0 = starts[sh]; /* read once: Python code below may change the buffer */
        if (i < s0 || i >= starts[sh + 1]) {
            res = python_at(b);
            goto done;
        }
        idx[b] = i;
        PyObject *key = PyLong_FromSsize_t(sh);
        if (key == NULL) goto done;
        PyObject *r = PyDict_GetItemWithError(readers, key);
        Py_DECREF(key);
        if (r == NULL) {
            res = PyErr_Occurred() ? NULL : hand_back(str_open, sh, -1, b);
            goto done;
        }
        PyObject *ck = PyObject_GetAttr(r, str_hot);
        if (ck == NULL) goto done;
        int ok = HOT_OK(ck);
        Tables *t = ok ? (Tables *)PyTuple_GET_ITEM(ck, HOT_TABLES) : NULL;
        if (ok && t->mark != call) { /* cut or changed since opened: its error (READING.md) */
            if (tables_check(t) < 0) {
                Py_DECREF(ck);
                goto done;
            }
            t->mark = call; /* once per call: see READING.md, "Compiled loops" */
        }
        if (ok) { /* owned: alloc() and fields run Python code, which may close a reader */
            Py_INCREF(t);
            row_t[nrow++] = t;
        }
        Py_DECREF(ck);
        if (!ok) {
            res = python_at(b);
            goto done;
        }
        Py_ssize_t j = i - (Py_ssize_t)s0;
        if (j >= t->n || !((const char *)t->checked.buf)[j >> CHUNK_SHIFT]) {
            res = j >= t->n ? python_at(b) : hand_back(str_check, sh, j >> CHUNK_SHIFT, b);
            goto done;
        }
        row_j[b] = j;
        row_s[b] = sh;
        prefetch_row(t, j); /* table rows: a cache miss each, else */
    }
    for (Py_ssize_t b = 0; b < n; b++) /* the key and member rows of those samples, ahead too */
        prefetch_members(row_t[b], (Py_ssize_t)row_j[b]);
    for (Py_ssize_t b = 0; b < n; b++) /* the members' first bytes (integers parsed next) */
        prefetch_data(row_t[b], (Py_ssize_t)row_j[b], 64);
    for (Py_ssize_t b = 0; b < n; b++) { /* keys, members, layout sizes */
        Tables *t = row_t[b];
        Py_ssize_t j = (Py_ssize_t)row_j[b], sh = (Py_ssize_t)row_s[b];
        uint64_t k0 = 0, k1 = 0, m0 = 0, m1 = 0;
        if (!tables_row(t, j, &k0, &k1, &m0, &m1)) {
            res = python_at(b);
            goto done;
        }
        PyObject *k = PyUnicode_DecodeUTF8((const char *)t->keys.buf + t->kbase + k0,
                                           (Py_ssize_t)(k1 - k0), "surrogateescape");
        if (k == NULL) goto done;
        PyList_SET_ITEM(keys, b, k);
        PyObject *path = PyList_GetItem(paths, sh);
        if (path == NULL) goto done;
        Py_INCREF(path);
        PyList_SET_ITEM(shards, b, path);
        for (uint64_t m = m0; m < m1; m++) {
            uint32_t e;
            uint64_t mo, ms;
            if (!member_get(t, m, &e, &mo, &ms)) {
                res = python_at(b);
                goto done;
            }
            Py_ssize_t p = field_pos(pos, PyTuple_GET_ITEM(t->exts, e), fields, intf, bnames,
                                     inames);
            if (p == POS_ERROR) goto done;
            if (p == -1) continue;
            int is_int = p < -1;
            Py_ssize_t q = is_int ? -2 - p : p;
            if (q >= (is_int ? ni : nf)) { /* a new field: a column of -1 */
                if (q >= cap) {
                    Py_ssize_t nc = cap * 2;
                    int64_t *l2 = PyMem_Realloc(lens, nc * n * sizeof(int64_t));
                    if (l2 == NULL) { PyErr_NoMemory(); goto done; }
                    lens = l2;
                    int64_t *v2 = PyMem_Realloc(ivals, nc * n * sizeof(int64_t));
                    if (v2 == NULL) { PyErr_NoMemory(); goto done; }
                    ivals = v2;
                    cap = nc;
                }
                int64_t *col = (is_int ? ivals : lens) + q * n;
                for (Py_ssize_t x = 0; x < n; x++) col[x] = -1;
                if (is_int) ni = q + 1; else nf = q + 1;
            }
            int64_t *cell = (is_int ? ivals : lens) + q * n + b;
            if (*cell != -1) { /* an extension twice in a sample (the guards refuse it) */
                res = python_at(b);
                goto done;
            }
            if (!is_int) {
                *cell = (int64_t)ms;
            } else {
                const char *at = NULL, *p = (const char *)t->data.buf + mo;
                int got = guarded_parse(p, (Py_ssize_t)ms, cell, &at);
                if (got < 0) {
                    mapped_raise(t->mapped, (Py_ssize_t)mo + (at - p));
                    goto done;
                }
                if (!got || *cell == -1) {
                    res = python_at(b); /* int() decides; -1 reads as missing */
                    goto done;
                }
            }
        }
    }
    /* layout: field f's members of samples 0..n-1, then field f + 1 */
    offs = PyByteArray_FromStringAndSize(NULL, nf * (n + 1) * 8);
    pres = PyByteArray_FromStringAndSize(NULL, nf * n);
    ints = PyByteArray_FromStringAndSize((const char *)ivals, ni * n * 8);
    if (!offs || !pres || !ints) goto done;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(offs), cum = 0;
    char *pr = PyByteArray_AS_STRING(pres);
    for (Py_ssize_t f = 0; f < nf; f++) {
        for (Py_ssize_t b = 0; b < n; b++) {
            int64_t len = lens[f * n + b];
            o[f * (n + 1) + b] = cum;
            pr[f * n + b] = len >= 0;
            if (len > 0) cum += len;
        }
        o[f * (n + 1) + n] = cum;
    }
    made = PyObject_CallFunction(alloc, "L", (long long)cum);
    if (made == NULL) goto done;
    if (!PyTuple_Check(made) || PyTuple_GET_SIZE(made) != 2) {
        PyErr_SetString(PyExc_TypeError, "batch: alloc must return (keep, buffer)");
        goto done;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(made, 1), &out, PyBUF_WRITABLE) < 0) goto done;
    have_out = 1;
    if (out.len < cum) {
        PyErr_SetString(PyExc_ValueError, "batch: alloc returned a short buffer");
        goto done;
    }
    /* pass 2: copies. row_t holds each Tables, so its buffers; each row and member is read
     * and bounded again and must fill exactly the cell pass 1 sized (Python code has run
     * since: a writable table may have changed) */
    char *dst = out.buf;
    for (Py_ssize_t b = 0; b < n; b++) {
        uint64_t k0 = 0, k1 = 0, m0 = 0, m1 = 0;
        Tables *t = row_t[b];
        if (b + 1 < n) /* the next sample's members: their first lines while this one copies */
            prefetch_data(row_t[b + 1], (Py_ssize_t)row_j[b + 1], 256);
        if (!tables_row(t, (Py_ssize_t)row_j[b], &k0, &k1, &m0, &m1)) {
            res = python_at(b);
            goto done;
        }
        for (uint64_t m = m0; m < m1; m++) {
            uint32_t e;
            uint64_t mo, ms;
            if (!member_get(t, m, &e, &mo, &ms)) {
                res = python_at(b);
                goto done;
            }
            PyObject *got = PyDict_GetItem(pos, PyTuple_GET_ITEM(t->exts, e));
            Py_ssize_t p = got ? PyLong_AsSsize_t(got) : -1;
            if (p < 0) continue;
            int64_t *at = o + p * (n + 1) + b;
            if (p >= nf || !pr[p * n + b] || (uint64_t)(at[1] - at[0]) != ms) {
                res = python_at(b);
                goto done;
            }
            const char *fa = NULL, *from = (const char *)t->data.buf + mo;
            if (guarded_copy(dst + at[0], from, (size_t)ms, &fa) < 0) {
                mapped_raise(t->mapped, (Py_ssize_t)mo + (fa - from));
                goto done;
            }
        }
    }
    PyObject_GC_Track(keys);
    PyObject_GC_Track(shards);
    res = PyTuple_Pack(9, PyTuple_GET_ITEM(made, 0), keys, bnames, inames, offs, pres, ints,
                       index, shards);
done:
    if (have_out) PyBuffer_Release(&out);
    Py_XDECREF(made);
    Py_XDECREF(keys);
    Py_XDECREF(bnames);
    Py_XDECREF(inames);
    Py_XDECREF(offs);
    Py_XDECREF(pres);
    Py_XDECREF(ints);
    Py_XDECREF(index);
    Py_XDECREF(shards);
    Py_XDECREF(pos);
    while (nrow > 0) Py_DECREF(row_t[--nrow]);
    PyMem_Free(row_t);
    PyMem_Free(row_j);
    PyMem_Free(row_s);
    PyMem_Free(lens);
    PyMem_Free(ivals);
    Py_DECREF(seq);
    PyBuffer_Release(&bst);
    return res;
}

/* ---- sample, take: ShardSet.sample and ShardSet.take over mappings ----------------------- */

#define WANT_MAX 64 /* sample(..., fields): flags of at most this many extensions, else hand back */

/* Where global sample `iobj` is, found by get_resolve: held references (resolved_clear). */
typedef struct {
    PyObject *ck;    /* the reader's hot tables (a HotTables) */
    PyObject *index; /* its "__index__" */
    PyObject *path;  /* its "__shard__" */
    Py_ssize_t j;    /* the sample in its shard */
} Resolved;

static void resolved_clear(Resolved *r) {
    Py_CLEAR(r->ck);
    Py_CLEAR(r->index);
    Py_CLEAR(r->path);
}

static Tables *resolved_tables(Resolved *r) {
    return (Tables *)PyTuple_GET_ITEM(r->ck, HOT_TABLES);
}

/* `*hb` = the hand-back of a case at position `at` (a new reference): 0, or -1 (an error). */
static int set_hand_back(PyObject **hb, PyObject *why, Py_ssize_t s, Py_ssize_t c,
                         Py_ssize_t at) {
    *hb = hand_back(why, s, c, at);
    return *hb == NULL ? -1 : 0;
}

/* Locate global sample `iobj`, look its reader up, check the mapping's size and that its
 * chunk passed the guard: 1 (`out` filled), 0 (`*hb` the HandBack, at position `at`) or -1
 * (an exception). starts: ShardSet's starts (int64, ns + 1, immutable); readers: a
 * read-only mapping shard -> reader (the LRU order is the caller's, read/pool.py). call 0:
 * the mapping's size is checked now; else once per Tables in call number `call`. */
static int get_resolve(PyObject *iobj, const int64_t *starts, Py_ssize_t ns, Py_ssize_t per,
                       PyObject *readers, PyObject *paths, uint64_t call,
                       Resolved *out, PyObject *fields, char *want, Py_ssize_t at,
                       PyObject **hb) {
    if (!PyLong_CheckExact(iobj)) return set_hand_back(hb, str_python, -1, -1, at);
    Py_ssize_t i = PyLong_AsSsize_t(iobj);
    if (i == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return set_hand_back(hb, str_python, -1, -1, at);
    }
    if (ns < 1 || ns > PyList_GET_SIZE(paths)) return set_hand_back(hb, str_python, -1, -1, at);
    int64_t total = starts[ns];
    /* total < 0: never from a ShardSet; i + total must not overflow */
    if (total < 0) return set_hand_back(hb, str_python, -1, -1, at);
    int neg = i < 0;
    if (neg) i += total;
    if (i < 0 || i >= total) return set_hand_back(hb, str_python, -1, -1, at);
    Py_ssize_t sh = shard_of(starts, ns, per, i);
    int64_t s0 = starts[sh], s1 = starts[sh + 1];
    /* s0 < 0: i - s0 must not overflow */
    if (s0 < 0 || i < s0 || i >= s1) return set_hand_back(hb, str_python, -1, -1, at);
    PyObject *key = PyLong_FromSsize_t(sh), *ck = NULL;
    int res = -1;
    if (key == NULL) return -1;
    PyObject *r = PyDict_GetItemWithError(readers, key); /* borrowed */
    if (r == NULL) {
        res = PyErr_Occurred() ? -1 : set_hand_back(hb, str_open, sh, -1, at);
        goto done;
    }
    Py_INCREF(r); /* held: the calls below run Python code */
    ck = PyObject_GetAttr(r, str_hot);
    if (ck == NULL) goto done_r;
    if (!HOT_OK(ck)) {
        res = set_hand_back(hb, str_python, -1, -1, at);
        goto done_r;
    }
    Tables *t = (Tables *)PyTuple_GET_ITEM(ck, HOT_TABLES);
    if (fields != NULL) { /* want[e]: extension e is in the frozenset `fields`; before the
                           * size check, since a contains may run Python code (an __eq__) */
        if (t->n_exts > WANT_MAX) {
            res = set_hand_back(hb, str_python, -1, -1, at);
            goto done_r;
        }
        for (Py_ssize_t e = 0; e < t->n_exts; e++) {
            int c = PySet_Contains(fields, PyTuple_GET_ITEM(t->exts, e));
            if (c < 0) goto done_r;
            want[e] = (char)c;
        }
    }
    if (call == 0 || t->mark != call) {
        /* the tar cut or changed since it was opened (one fstat): its error, not its bytes
         * (READING.md); a cut after this is caught by the fault guard of the copies */
        if (tables_check(t) < 0) goto done_r;
        if (call) t->mark = call;
    }
    if (sh >= PyList_GET_SIZE(paths)) { /* the calls above ran code that shortened it */
        res = set_hand_back(hb, str_python, -1, -1, at);
        goto done_r;
    }
    Py_ssize_t j = i - (Py_ssize_t)s0;
    if (j >= t->n) {
        res = set_hand_back(hb, str_python, -1, -1, at);
        goto done_r;
    }
    if (!((const char *)t->checked.buf)[j >> CHUNK_SHIFT]) {
        res = set_hand_back(hb, str_check, sh, j >> CHUNK_SHIFT, at);
        goto done_r;
    }
    out->index = neg ? PyLong_FromSsize_t(i) : Py_NewRef(iobj);
    if (out->index == NULL) goto done_r;
    /* owned: tables_dict hashes extension names (Python code) before it stores the path */
    out->path = Py_NewRef(PyList_GET_ITEM(paths, sh));
    out->ck = ck;
    ck = NULL;
    out->j = j;
    res = 1;
done_r:
    Py_XDECREF(ck);
    Py_DECREF(r);
done:
    Py_DECREF(key);
    return res;
}

/* Global sample `iobj` as tables_dict gives it (meta_first: Block.to_samples' key order), or
 * a HandBack (at 0) or NULL with an exception; the arguments as get_resolve's. */
static PyObject *get_one(PyObject *iobj, const int64_t *starts, Py_ssize_t ns, Py_ssize_t per,
                         PyObject *readers, PyObject *paths, uint64_t call, int meta_first,
                         PyObject *fields) {
    Resolved r = {NULL, NULL, NULL, 0};
    char want[WANT_MAX];
    PyObject *hb = NULL;
    int ok = get_resolve(iobj, starts, ns, per, readers, paths, call, &r, fields, want, 0, &hb);
    if (ok <= 0) return ok < 0 ? NULL : hb;
    PyObject *res = tables_dict(resolved_tables(&r), r.j, fields == NULL ? NULL : want, r.path,
                                r.index, meta_first);
    resolved_clear(&r);
    if (res == Py_None) {
        Py_DECREF(res);
        return python_at(0);
    }
    return res;
}




/* Parse (starts: int64 bytes, per, readers: dict, paths: list) at args[1..4]; -1 on error. */
static int get_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t max_args, const char *usage,
                    const int64_t **starts, Py_ssize_t *ns, Py_ssize_t *per) {
    if (nargs < 5 || nargs > max_args || !PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) % 8 ||
        !PyDict_Check(args[3]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *starts = (const int64_t *)PyBytes_AS_STRING(args[1]); /* immutable */
    *ns = PyBytes_GET_SIZE(args[1]) / 8 - 1;
    *per = PyLong_AsSsize_t(args[2]);
    return *per == -1 && PyErr_Occurred() ? -1 : 0;
}

/* sample(i, starts, per, readers, paths[, fields]) -> dict | HandBack
 * ShardSet.sample(i, fields): i a global index (an exact int, negatives from the end); fields
 * None (or left out: every member) or a frozenset of the extensions to read (anything else
 * hands back, as more than WANT_MAX extensions do);
 * starts: ShardSet's starts (int64, n_shards + 1, as bytes); per, readers, paths as batch()
 * (readers only looked up: the pool keeps its LRU order itself). A HandBack (at 0) instead:
 * "open" (shard not open), "check" (its chunk unchecked), "python" (not an int or out of
 * range, not mapped, a bound that does not hold); a tar cut or changed since it was opened
 * raises its error. */
static PyObject *k_sample(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    const int64_t *starts;
    Py_ssize_t ns, per;
    if (get_args(args, nargs, 6,
                 "sample(i, starts: int64 bytes, per, readers: dict, paths: list[, fields])",
                 &starts, &ns, &per) < 0)
        return NULL;
    PyObject *fields = nargs == 6 && args[5] != Py_None ? args[5] : NULL;
    if (fields != NULL && !PyFrozenSet_CheckExact(fields)) return python_at(0);
    return get_one(args[0], starts, ns, per, args[3], args[4], 0, 0, fields);
}

/* take(indices, starts, per, readers, paths) -> [dict, ...] | HandBack
 * ShardSet.take: get_one of each global index of the list `indices`, in Block.to_samples' key
 * order (a streaming window's samples, copied out as they are yielded); each mapping's size is
 * checked once per call, before its first byte is copied (the consumer runs between two takes,
 * so every take checks). A HandBack at the first index the loop does not read, as sample's. */
static PyObject *k_take(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    const int64_t *starts;
    Py_ssize_t ns, per;
    if (get_args(args, nargs, 5,
                 "take(indices: list, starts: int64 bytes, per, readers: dict, paths: list)",
                 &starts, &ns, &per) < 0)
        return NULL;
    /* a snapshot: Python code run below (hashes) may change the caller's list */
    PyObject *seq = PySequence_Tuple(args[0]);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    uint64_t call = ++kernel_calls;
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject_GC_UnTrack(out); /* NULL slots until filled: see Tables_samples */
    Resolved *rs = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Resolved));
    PyObject *res = NULL;
    Py_ssize_t got = 0; /* entries of rs filled */
    if (rs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* pass 1: locate, look up, cut check (each mapping once); pass 2: copy, prefetching */
    for (; got < n; got++) {
        PyObject *hb = NULL;
        int ok = get_resolve(PyTuple_GET_ITEM(seq, got), starts, ns, per, args[3], args[4], call,
                             &rs[got], NULL, NULL, got, &hb);
        if (ok <= 0) {
            res = ok < 0 ? NULL : hb;
            goto done;
        }
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        if (b + 6 < n) prefetch_row(resolved_tables(&rs[b + 6]), rs[b + 6].j);
        if (b + 4 < n) prefetch_members(resolved_tables(&rs[b + 4]), rs[b + 4].j);
        if (b + 2 < n) prefetch_data(resolved_tables(&rs[b + 2]), rs[b + 2].j, 512);
        PyObject *d = tables_dict(resolved_tables(&rs[b]), rs[b].j, NULL, rs[b].path,
                                  rs[b].index, 1);
        if (d == NULL || d == Py_None) { /* NULL: the error; None: hand back */
            res = d == NULL ? NULL : python_at(b);
            Py_XDECREF(d);
            goto done;
        }
        PyList_SET_ITEM(out, b, d);
    }
    PyObject_GC_Track(out);
    res = out;
    out = NULL;
done:
    while (got > 0) resolved_clear(&rs[--got]);
    PyMem_Free(rs);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return res;
}

static PyMethodDef kernel_methods[] = {
    {"take", (PyCFunction)(void (*)(void))k_take, METH_FASTCALL,
     "take(indices, starts, per, readers, paths): ShardSet.take(indices) as dicts, or "
     "a HandBack."},
    {"sample", (PyCFunction)(void (*)(void))k_sample, METH_FASTCALL,
     "sample(i, starts, per, readers, paths[, fields]): ShardSet.sample(i, fields) as a "
     "dict, or a HandBack."},
    {"gather", (PyCFunction)(void (*)(void))k_gather, METH_FASTCALL,
     "gather(tables, shards, slot, local): keys, counts and member table bytes of a batch, "
     "or a HandBack at the first sample to hand back."},
    {"batch", (PyCFunction)(void (*)(void))k_batch, METH_FASTCALL,
     "batch(indices, starts, per, readers, paths, fields, int_fields, alloc): a whole batch "
     "in the field-major layout, or a HandBack."},
    {"pack", (PyCFunction)(void (*)(void))k_pack, METH_FASTCALL,
     "pack(out, datas, src, offset, size, dest, vals, start): copy byte members, parse "
     "integer members; None when done, else a HandBack at the first member to hand back."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "tarindex.read._kernel",
    "The read kernel's per-sample loops, compiled (tarindex/read/ (checks.py) holds the rules).", -1,
    kernel_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernel(void) {
    if (PyType_Ready(&TablesType) < 0 || PyType_Ready(&MappedType) < 0) return NULL;
    guard_install();
    str_hot = PyUnicode_InternFromString("hot");
    str_open = PyUnicode_InternFromString("open");
    str_check = PyUnicode_InternFromString("check");
    str_python = PyUnicode_InternFromString("python");
    str_key = PyUnicode_InternFromString("__key__");
    str_shard = PyUnicode_InternFromString("__shard__");
    str_index = PyUnicode_InternFromString("__index__");
    if (!str_hot || !str_open || !str_check || !str_python || !str_key ||
        !str_shard || !str_index)
        return NULL;
    /* the one HandBack class (a NamedTuple defined in Python): built here, never redefined */
    PyObject *hot = PyImport_ImportModule("tarindex.read.hot");
    if (hot == NULL) return NULL;
    Py_XSETREF(HandBackType, PyObject_GetAttrString(hot, "HandBack"));
    Py_DECREF(hot);
    if (HandBackType == NULL) return NULL;
    if (!PyType_Check(HandBackType) ||
        !PyType_IsSubtype((PyTypeObject *)HandBackType, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "tarindex.read.hot.HandBack must be a NamedTuple");
        return NULL;
    }
    PyObject *m = PyModule_Create(&kernel_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Tables", (PyObject *)&TablesType) < 0 ||
        PyModule_AddObjectRef(m, "Mapped", (PyObject *)&MappedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
