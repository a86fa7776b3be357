/* A body the kernel sends from a file: FileRange(fd, offset, length). The compiled disk hit
 * answers a long body so (disk.c, PlainHits.sendfile_from) once it has read and checked the
 * record; the front hands it to sendfile, the body never copied through user space. Its len()
 * is its length, as the body it stands for. */
#include "hits.h"

static PyObject *FileRange_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fd", "offset", "length", NULL};
    int fd;
    long long offset, length;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iLL", names, &fd, &offset, &length))
        return NULL;
    if (fd < 0 || offset < 0 || length < 0) {
        PyErr_SetString(PyExc_ValueError, "FileRange(fd, offset, length): none negative");
        return NULL;
    }
    return file_range(type, fd, offset, length);
}

PyObject *file_range(PyTypeObject *type, int fd, long long offset, long long length) {
    FileRange *self = (FileRange *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->fd = fd;
        self->offset = offset;
        self->length = length;
    }
    return (PyObject *)self;
}

static Py_ssize_t FileRange_len(FileRange *self) {
    return (Py_ssize_t)self->length;
}

static PyObject *FileRange_repr(FileRange *self) {
    return PyUnicode_FromFormat("FileRange(fd=%d, offset=%lld, length=%lld)", self->fd,
                                self->offset, self->length);
}

static PyMemberDef FileRange_members[] = {
    {"fd", T_INT, offsetof(FileRange, fd), READONLY, "the descriptor of the file"},
    {"offset", T_LONGLONG, offsetof(FileRange, offset), READONLY, "where the body begins"},
    {"length", T_LONGLONG, offsetof(FileRange, length), READONLY, "its bytes"},
    {NULL}};

static PySequenceMethods FileRange_sequence = {.sq_length = (lenfunc)FileRange_len};

PyTypeObject FileRangeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.handler._hits.FileRange",
    .tp_basicsize = sizeof(FileRange),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FileRange(fd, offset, length): a body the kernel sends from a file; len() is\n"
              "its length. Valid while the answer is written (the descriptor is the disk\n"
              "tier's).",
    .tp_new = FileRange_new,
    .tp_repr = (reprfunc)FileRange_repr,
    .tp_members = FileRange_members,
    .tp_as_sequence = &FileRange_sequence,
};
