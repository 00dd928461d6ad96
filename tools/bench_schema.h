/*
 * bench_schema.h — the JSON schema `cellm bench --sampling` constrains
 * replies to (docs/grammar.md), shared with bench/grammar_mask.c.
 */
#ifndef CELLM_BENCH_SCHEMA_H
#define CELLM_BENCH_SCHEMA_H

/* Ten properties of the usual kinds: strings, bounded integers, a number,
 * an enum, a boolean, an array of strings and a nested object. */
#define BENCH_SCHEMA                                                                               \
    "{\"type\":\"object\",\"properties\":{"                                                        \
    "\"id\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":99999},"                               \
    "\"name\":{\"type\":\"string\",\"maxLength\":40},"                                             \
    "\"description\":{\"type\":\"string\",\"maxLength\":200},"                                     \
    "\"price\":{\"type\":\"number\",\"minimum\":0,\"maximum\":10000},"                             \
    "\"currency\":{\"enum\":[\"EUR\",\"USD\",\"GBP\"]},"                                           \
    "\"in_stock\":{\"type\":\"boolean\"},"                                                         \
    "\"quantity\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":1000},"                          \
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":20},"               \
    "\"maxItems\":5},"                                                                             \
    "\"category\":{\"type\":\"string\",\"maxLength\":30},"                                         \
    "\"dimensions\":{\"type\":\"object\",\"properties\":{\"width\":{\"type\":\"number\"},"         \
    "\"height\":{\"type\":\"number\"}},\"required\":[\"width\",\"height\"]}},"                     \
    "\"required\":[\"id\",\"name\",\"description\",\"price\",\"currency\",\"in_stock\","           \
    "\"quantity\",\"tags\",\"category\",\"dimensions\"],\"additionalProperties\":false}"

#endif
