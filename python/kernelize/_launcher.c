/* kernelize's launch stub: cuLaunchKernel with prepared arguments, called from Python with the
 * stream and the tensors' addresses only (launch.py builds it with the system C compiler on
 * first use, as Triton builds its launchers; without a compiler the ctypes path is used).
 *
 *   init(address_of_cuLaunchKernel)
 *   prepare(func, g0, g1, g2, b0, b1, b2, smem, n_pointers, scalars) -> bytes
 *       scalars: a tuple of ints (`long long`) and floats (`float`), in ABI order after the
 *       pointers (every SPEC ABI puts its pointers first)
 *   launch(prepared, stream, p0, p1, ...) -> CUresult as an int
 *
 * `prepared` is an immutable bytes object: a call reads it and builds the argument array on its
 * own stack, so concurrent calls from several threads share nothing mutable. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARGS 16

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);

typedef struct {
    void *func;
    unsigned dims[7]; /* grid x, y, z, block x, y, z, dynamic shared memory */
    int n_ptr;
    int n_scalar;
    union {
        long long ll;
        float f;
    } scalar[MAX_ARGS];
} Prepared;

static launch_fn cu_launch = NULL;

static PyObject *k_init(PyObject *self, PyObject *arg) {
    unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (addr == 0) {
        PyErr_SetString(PyExc_ValueError, "init: the address of cuLaunchKernel is 0");
        return NULL;
    }
    cu_launch = (launch_fn)(uintptr_t)addr;
    Py_RETURN_NONE;
}

static PyObject *k_prepare(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "prepare(func, g0, g1, g2, b0, b1, b2, smem, n_pointers, scalars)");
        return NULL;
    }
    Prepared p;
    memset(&p, 0, sizeof p);
    p.func = (void *)(uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
    for (int i = 0; i < 7; ++i) p.dims[i] = (unsigned)PyLong_AsUnsignedLong(args[1 + i]);
    p.n_ptr = (int)PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    PyObject *sc = args[9];
    if (!PyTuple_Check(sc)) {
        PyErr_SetString(PyExc_TypeError, "prepare: scalars must be a tuple of ints and floats");
        return NULL;
    }
    p.n_scalar = (int)PyTuple_GET_SIZE(sc);
    if (p.n_ptr < 0 || p.n_ptr + p.n_scalar > MAX_ARGS) {
        PyErr_SetString(PyExc_ValueError, "prepare: more than 16 kernel arguments");
        return NULL;
    }
    for (int i = 0; i < p.n_scalar; ++i) {
        PyObject *v = PyTuple_GET_ITEM(sc, i);
        if (PyFloat_Check(v)) {
            p.scalar[i].f = (float)PyFloat_AS_DOUBLE(v);
        } else if (PyLong_Check(v)) {
            p.scalar[i].ll = PyLong_AsLongLong(v);
            if (PyErr_Occurred()) return NULL;
        } else {
            PyErr_SetString(PyExc_TypeError, "prepare: a scalar is neither int nor float");
            return NULL;
        }
    }
    return PyBytes_FromStringAndSize((const char *)&p, sizeof p);
}

static PyObject *k_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || !PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != sizeof(Prepared)) {
        PyErr_SetString(PyExc_TypeError, "launch(prepared, stream, pointers...)");
        return NULL;
    }
    const Prepared *p = (const Prepared *)PyBytes_AS_STRING(args[0]);
    if (nargs - 2 != p->n_ptr) {
        PyErr_Format(PyExc_TypeError, "launch: %d pointers expected, %zd given", p->n_ptr,
                     nargs - 2);
        return NULL;
    }
    if (cu_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch: init(cuLaunchKernel) was not called");
        return NULL;
    }
    void *stream = (void *)(uintptr_t)PyLong_AsUnsignedLongLong(args[1]);
    uint64_t ptr[MAX_ARGS];
    void *argv[MAX_ARGS];
    for (int i = 0; i < p->n_ptr; ++i) {
        ptr[i] = PyLong_AsUnsignedLongLong(args[2 + i]);
        argv[i] = &ptr[i];
    }
    if (PyErr_Occurred()) return NULL;
    for (int i = 0; i < p->n_scalar; ++i) argv[p->n_ptr + i] = (void *)&p->scalar[i];
    int res = cu_launch(p->func, p->dims[0], p->dims[1], p->dims[2], p->dims[3], p->dims[4],
                        p->dims[5], p->dims[6], stream, argv, NULL);
    return PyLong_FromLong(res);
}

static PyMethodDef methods[] = {
    {"init", (PyCFunction)k_init, METH_O, "init(address of cuLaunchKernel)"},
    {"prepare", (PyCFunction)(void (*)(void))k_prepare, METH_FASTCALL,
     "prepare(func, g0, g1, g2, b0, b1, b2, smem, n_pointers, scalars) -> bytes"},
    {"launch", (PyCFunction)(void (*)(void))k_launch, METH_FASTCALL,
     "launch(prepared, stream, pointers...) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernelize_launcher", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit__kernelize_launcher(void) { return PyModule_Create(&module); }
