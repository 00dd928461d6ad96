/* schema.c — JSON Schema to GBNF (see schema.h). */
#include "schema.h"

cellm_status schema_to_gbnf(const char *schema, size_t len, char **out, size_t *out_len,
                            cellm_error *err) {
    (void)schema;
    (void)len;
    *out = NULL;
    *out_len = 0;
    return err_set(err, CELLM_ERR_UNSUPPORTED, "json schema: not yet");
}
