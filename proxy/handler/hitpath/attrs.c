/* The attributes of entries, counters and messages the hit path reads and writes in their
 * slots (slots.h), and the strings it compares with, interned once. */
#include "hits.h"

Attr attrs[A_COUNT] = {
    {"method"}, {"version"}, {"should_close"}, {"upgrade"}, {"chunked"}, {"path"},
    {"raw_headers"}, {"key"}, {"initial_age"}, {"stored_at"}, {"lifetime"}, {"directives"},
    {"rendered"}, {"headers"}, {"status"}, {"payload"}, {"size"}, {"requests"}, {"hits"}, {"hit_bytes"},
    {"bytes_served"}, {"hits_from_disk"},
};

PyObject *s_touch, *s_record_hit, *s_no_cache;

/* Interns the attribute names and the strings the hit path compares with; -1 on error. */
int attrs_init(void) {
    for (int i = 0; i < A_COUNT; i++) {
        attrs[i].name = PyUnicode_InternFromString(attrs[i].text);
        if (attrs[i].name == NULL)
            return -1;
    }
    s_touch = PyUnicode_InternFromString("touch");
    s_record_hit = PyUnicode_InternFromString("record_hit");
    s_no_cache = PyUnicode_InternFromString("no-cache");
    return (s_touch == NULL || s_record_hit == NULL || s_no_cache == NULL) ? -1 : 0;
}
