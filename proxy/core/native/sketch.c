/* Count-min sketches: sizing and halving (counting is inline in native.h). */
#include "native.h"

int sketch_init(Sketch *s, long long keys, uint8_t ceiling, long long periods) {
    uint64_t width = 64;
    while ((long long)width < keys) width *= 2;
    uint8_t *rows = PyMem_Calloc((size_t)(4 * width), 1);
    if (rows == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(s->rows);
    s->rows = rows;
    s->width = width;
    s->ceiling = ceiling;
    s->added = 0;
    s->period = (long long)width * periods;
    return 0;
}

void sketch_halve(Sketch *s) {
    for (uint64_t i = 0; i < 4 * s->width; i++) s->rows[i] >>= 1;
    s->added = 0;
}

