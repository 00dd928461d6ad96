/*
 * serve_json.h — cJSON helpers shared by the server's request parsers
 * (serve_req.c, serve_tools.c, serve_responses.c).
 */
#ifndef CELLM_SERVE_JSON_H
#define CELLM_SERVE_JSON_H

#include <cjson/cJSON.h>

/* The field `name` of `obj`, or NULL when it is absent or null. */
const cJSON *serve_field(const cJSON *obj, const char *name);

#endif
