/* The forest walk of predictor/trees.py in C: the same records, the same comparisons, the same
 * summation order, so the same bits as the numpy walk (tests/predictor/test_forest.py checks both).
 *
 * Why C: a prediction walks ~9,000 (row, tree) pairs ten levels deep.  numpy does that as ~60
 * whole-array passes, each paying a pass over memory and a temporary; here each step is a load
 * and a compare in registers (5x less time on the shipped bundles, benchmarks/bench_predict.py).
 * The build is optional (setup.py): without a compiler perfcast falls back to the numpy walk.
 *
 * A prediction's nodes are mostly not in cache (the forest is tens of MB; a daemon's other work
 * and other processes evict it), so the walk is bound by memory latency, not arithmetic.  Trees
 * are therefore walked 64 at a time, level by level, so that their node loads are independent,
 * and each next node is prefetched as soon as it is known: the CPU then has many misses in
 * flight instead of waiting for each load in turn (about 2x less time than 16 trees without
 * prefetching, with the caches flushed before each walk).
 *
 * Nothing here trusts its input: every buffer's size is checked against what is read from it and
 * every node index is checked before it is followed (Forest._validate checks them at load too;
 * this is a second wall, not the first).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FEATURE_BITS 3
#define FEATURE_MASK ((1 << FEATURE_BITS) - 1)
#define COLUMNS (1 << FEATURE_BITS)
#define BATCH 64

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

typedef struct {
    double value;      /* threshold of an internal node, value of a leaf */
    int64_t word;      /* next << 3 | feature */
} record_t;

static int get(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: a contiguous%s buffer is needed", name,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
}

/* forest_sums(records, roots, first_tree, trees, depth, X, out) -> None
 *
 * records     bytes of the node records (16 bytes each: float64, int64; native byte order)
 * roots       int32 per tree: its root's node index
 * first_tree, trees, depth   int64 per unit (row): its model's first tree, tree count, depth
 * X           float64, units x 8: the unit's features (+inf in column 7 and unused ones)
 * out         float64 per unit: the sum of the unit's leaves, tree by tree (no base score)
 */
static PyObject *forest_sums(PyObject *self, PyObject *args) {
    PyObject *objs[7];
    Py_buffer b[7];
    static const char *names[7] = {"records", "roots", "first_tree", "trees", "depth", "X", "out"};
    int got = 0;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6]))
        return NULL;
    for (; got < 7; got++)
        if (get(objs[got], &b[got], got == 6, names[got]) < 0)
            goto done;

    const record_t *rec = (const record_t *)b[0].buf;
    const int32_t *roots = (const int32_t *)b[1].buf;
    const int64_t *first = (const int64_t *)b[2].buf, *trees = (const int64_t *)b[3].buf,
                  *depth = (const int64_t *)b[4].buf;
    const double *X = (const double *)b[5].buf;
    double *out = (double *)b[6].buf;
    const int64_t n_nodes = b[0].len / (Py_ssize_t)sizeof(record_t);
    const int64_t n_roots = b[1].len / (Py_ssize_t)sizeof(int32_t);
    const int64_t n_units = b[6].len / (Py_ssize_t)sizeof(double);
    if (b[0].len % (Py_ssize_t)sizeof(record_t) || b[1].len % (Py_ssize_t)sizeof(int32_t) ||
        b[2].len != n_units * 8 || b[3].len != n_units * 8 || b[4].len != n_units * 8 ||
        b[5].len != n_units * COLUMNS * 8 || b[6].len % 8) {
        PyErr_SetString(PyExc_ValueError, "forest_sums: buffer sizes do not agree");
        goto done;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t u = 0; u < n_units && !bad; u++) {
        const double *x = X + COLUMNS * u;
        const int64_t t0 = first[u], nt = trees[u], dep = depth[u];
        double sum = 0.0;
        if (t0 < 0 || nt < 0 || t0 > n_roots || nt > n_roots - t0 || dep < 0 || dep > 64) {
            bad = 1;
            break;
        }
        for (int64_t a = 0; a < nt && !bad; a += BATCH) {
            const int m = (int)(nt - a < BATCH ? nt - a : BATCH);
            int64_t node[BATCH];
            for (int j = 0; j < m; j++) {
                node[j] = roots[t0 + a + j];
                if (node[j] < 0 || node[j] >= n_nodes)
                    bad = 1;
                else
                    PREFETCH(rec + node[j]);
            }
            for (int64_t d = 0; d < dep && !bad; d++) {
                for (int j = 0; j < m; j++) {
                    const record_t *r = rec + node[j];
                    const int64_t next = (r->word >> FEATURE_BITS) + (x[r->word & FEATURE_MASK] < r->value);
                    /* An internal node's children are next and next + 1; a leaf points at itself. */
                    if (next < 0 || next >= n_nodes)
                        bad = 1;
                    else {
                        node[j] = next;
                        PREFETCH(rec + next);
                    }
                }
            }
            /* Tree by tree, in the library's order: the numpy walk's bincount adds the same way. */
            for (int j = 0; j < m && !bad; j++)
                sum += rec[node[j]].value;
        }
        out[u] = sum;
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "forest_sums: a tree points outside the forest");
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"forest_sums", forest_sums, METH_VARARGS,
     "forest_sums(records, roots, first_tree, trees, depth, X, out): sums of leaves per row."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_walk", "The forest walk in C.", -1, methods};

PyMODINIT_FUNC PyInit__walk(void) { return PyModule_Create(&module); }
