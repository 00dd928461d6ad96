/*
 * serve_image.c — pictures in chat requests for `cellm serve --mmproj`:
 * an `image_url` content part's `data:` URL (base64 PNG or JPEG) into the
 * picture's embeddings (image_decode, then cellm_image_encode), which the
 * request carries to the engine (cellm_request_params.images).
 *
 * Everything here is untrusted input: remote URLs are refused, never
 * fetched; the URL's header, its base64 and the picture are checked, each
 * failure a 400 with a message. Sizes are bounded by the request body
 * (--max-body) and by SERVE_IMAGE_MAX_PIXELS before any pixel is
 * allocated.
 *
 * Encoded pictures are kept by the content hash of their file, so a
 * picture sent again (the next turn of a chat resends the history) is not
 * encoded again: up to SERVE_IMAGE_CACHE_BYTES of embeddings, least
 * recently used first out. A hit hands the request its own copy.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "image_file.h"
#include "serve.h"

#define CACHE_SLOTS 64

typedef struct entry {
    uint64_t h1, h2; /* the file's content hash; h1 == h2 == 0: empty */
    size_t bytes;
    uint64_t used; /* tick of the last use */
    cellm_image_embed *e;
} entry;

struct serve_images {
    cellm_mmproj *mm;
    pthread_mutex_t mu; /* guards the cache */
    entry slot[CACHE_SLOTS];
    size_t bytes;
    uint64_t tick;
    atomic_ullong hits, misses;
};

bool serve_images_create(cellm_mmproj *mm, serve_images **out) {
    serve_images *im = calloc(1, sizeof *im);
    if (!im) return false;
    im->mm = mm;
    pthread_mutex_init(&im->mu, NULL);
    *out = im;
    return true;
}

void serve_images_free(serve_images *im) {
    if (!im) return;
    for (int i = 0; i < CACHE_SLOTS; i++) cellm_image_embed_free(im->slot[i].e);
    pthread_mutex_destroy(&im->mu);
    free(im);
}

void serve_images_stats(serve_images *im, uint64_t *hits, uint64_t *misses) {
    *hits = im ? atomic_load(&im->hits) : 0;
    *misses = im ? atomic_load(&im->misses) : 0;
}

static size_t embed_bytes(const cellm_image_embed *e) {
    return (size_t)e->n_tokens * (size_t)e->n_embd * sizeof(float);
}

/* A new copy of e, or NULL. */
static cellm_image_embed *embed_copy(const cellm_image_embed *e) {
    cellm_image_embed *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *e;
    c->embd = malloc(embed_bytes(e));
    if (!c->embd) {
        free(c);
        return NULL;
    }
    memcpy(c->embd, e->embd, embed_bytes(e));
    return c;
}

/* Two independent 64-bit hashes of data[0..n): FNV-1a, and a
 * multiply-xorshift over 8-byte words. */
static void content_hash(const uint8_t *p, size_t n, uint64_t *h1, uint64_t *h2) {
    uint64_t a = 0xcbf29ce484222325ull, b = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (size_t i = 0; i < n; i++) a = (a ^ p[i]) * 0x100000001b3ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        b = (b ^ w) * 0xbf58476d1ce4e5b9ull;
        b ^= b >> 31;
    }
    for (; i < n; i++) b = (b ^ p[i]) * 0x94d049bb133111ebull;
    *h1 = a | 1; /* never the empty slot's 0 */
    *h2 = b;
}

/* A copy of the cached picture of this hash, or NULL. */
static cellm_image_embed *cache_get(serve_images *im, uint64_t h1, uint64_t h2) {
    cellm_image_embed *c = NULL;
    pthread_mutex_lock(&im->mu);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        entry *s = &im->slot[i];
        if (s->e && s->h1 == h1 && s->h2 == h2) {
            s->used = ++im->tick;
            c = embed_copy(s->e);
            break;
        }
    }
    pthread_mutex_unlock(&im->mu);
    return c;
}

/* Keeps a copy of e under the hash, making room least recently used
 * first. Nothing when it is larger than the whole budget or memory is
 * short. */
static void cache_put(serve_images *im, uint64_t h1, uint64_t h2, const cellm_image_embed *e) {
    size_t bytes = embed_bytes(e);
    if (bytes > SERVE_IMAGE_CACHE_BYTES) return;
    cellm_image_embed *c = embed_copy(e);
    if (!c) return;
    pthread_mutex_lock(&im->mu);
    for (;;) {
        int victim = -1, empty = -1;
        for (int i = 0; i < CACHE_SLOTS; i++) {
            entry *s = &im->slot[i];
            if (s->e && s->h1 == h1 && s->h2 == h2) { /* another thread put it meanwhile */
                pthread_mutex_unlock(&im->mu);
                cellm_image_embed_free(c);
                return;
            }
            if (!s->e && empty < 0) empty = i;
            if (s->e && (victim < 0 || s->used < im->slot[victim].used)) victim = i;
        }
        if (empty >= 0 && im->bytes + bytes <= SERVE_IMAGE_CACHE_BYTES) {
            im->slot[empty] = (entry){h1, h2, bytes, ++im->tick, c};
            im->bytes += bytes;
            break;
        }
        entry *v = &im->slot[victim]; /* full or over budget: one goes */
        im->bytes -= v->bytes;
        cellm_image_embed_free(v->e);
        *v = (entry){0};
    }
    pthread_mutex_unlock(&im->mu);
}

/* The value of a base64 digit, or -1. */
static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes standard base64 (padding optional, no other characters) into a
 * new buffer *out of *n bytes. False on a bad character or length. */
static bool b64_decode(const char *s, size_t len, uint8_t **out, size_t *n) {
    while (len > 0 && s[len - 1] == '=') len--;
    if (len % 4 == 1) return false;
    uint8_t *buf = malloc(len / 4 * 3 + 3);
    if (!buf) return false;
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            free(buf);
            return false;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[k++] = (uint8_t)(acc >> bits);
        }
    }
    *out = buf;
    *n = k;
    return true;
}

cellm_image_embed *serve_image_from_url(serve_images *im, const char *url, const char *param,
                                        serve_err *e) {
    if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8)) {
        serr(e, 400, "invalid_value", param,
             "'%s': remote image URLs are not fetched; send the picture as a data: URL "
             "(data:image/png;base64,... or data:image/jpeg;base64,...)",
             param);
        return NULL;
    }
    const char *comma = strchr(url, ',');
    if (strncasecmp(url, "data:", 5) || !comma) {
        serr(e, 400, "invalid_value", param,
             "'%s' must be a data: URL (data:image/png;base64,... or data:image/jpeg;base64,...)",
             param);
        return NULL;
    }
    /* The header: a picture's media type, base64-encoded. */
    const char *mt = url + 5;
    size_t hl = (size_t)(comma - mt);
    static const char b64[] = ";base64";
    bool is_b64 = hl >= sizeof b64 - 1 && !strncasecmp(comma - (sizeof b64 - 1), b64, 7);
    size_t tl = is_b64 ? hl - (sizeof b64 - 1) : hl;
    const char *semi = memchr(mt, ';', tl);
    if (semi) tl = (size_t)(semi - mt); /* parameters such as charset */
    bool known = (tl == 9 && !strncasecmp(mt, "image/png", 9)) ||
                 (tl == 10 && !strncasecmp(mt, "image/jpeg", 10)) ||
                 (tl == 9 && !strncasecmp(mt, "image/jpg", 9));
    if (!known || !is_b64) {
        serr(e, 400, "invalid_value", param,
             "'%s': the data: URL must be base64 of a PNG or JPEG picture (image/png or "
             "image/jpeg with ;base64), not \"%.*s\"",
             param, (int)(hl > 64 ? 64 : hl), mt);
        return NULL;
    }
    uint8_t *data = NULL;
    size_t n = 0;
    if (!b64_decode(comma + 1, strlen(comma + 1), &data, &n)) {
        serr(e, 400, "invalid_value", param, "'%s': the data: URL's base64 is malformed", param);
        return NULL;
    }
    if (n == 0) {
        free(data);
        serr(e, 400, "invalid_value", param, "'%s': the picture is empty", param);
        return NULL;
    }
    uint64_t h1, h2;
    content_hash(data, n, &h1, &h2);
    cellm_image_embed *out = cache_get(im, h1, h2);
    if (out) {
        atomic_fetch_add(&im->hits, 1);
        free(data);
        return out;
    }
    atomic_fetch_add(&im->misses, 1);
    cellm_error err;
    err_clear(&err);
    uint8_t *rgb = NULL;
    int32_t w = 0, h = 0;
    cellm_status st = image_decode_max(data, n, SERVE_IMAGE_MAX_PIXELS, &rgb, &w, &h, &err);
    free(data);
    if (st) {
        serr(e, st == CELLM_ERR_NO_MEMORY ? 500 : 400, "invalid_value", param, "'%s': %s", param,
             err.msg);
        return NULL;
    }
    st = cellm_image_encode(im->mm, rgb, w, h, &out);
    free(rgb);
    if (st) {
        serr(e, st == CELLM_ERR_NO_MEMORY ? 500 : 400, "invalid_value", param, "'%s': %s", param,
             cellm_last_error());
        return NULL;
    }
    cache_put(im, h1, h2, out);
    return out;
}
