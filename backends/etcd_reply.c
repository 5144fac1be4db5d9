/* Reading etcd's replies: see etcd_reply.h. No I/O. */
#include "backends/etcd_reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd_json.h"

int etcd_kv_read(json_object *o, struct etcd_kv *kv)
{
    json_object *k = etcd_get(o, "key");
    size_t len, vlen;
    memset(kv, 0, sizeof *kv);
    if (!k || !json_object_is_type(k, json_type_string))
        return -1;
    /* base64 is 4 bytes for 3: the decoding fits in the encoding's length */
    len = (size_t)json_object_get_string_len(k);
    if (!(kv->key = malloc(len + 1)))
        return -1;
    if (etcd_bytes(k, (unsigned char *)kv->key, &len) != 0) {
        free(kv->key);
        kv->key = NULL;
        return -1;
    }
    kv->key[len] = '\0';
    kv->klen = len;
    kv->create = etcd_int(o, "create_revision");
    kv->mod = etcd_int(o, "mod_revision");
    kv->lease = etcd_int(o, "lease");
    vlen = sizeof kv->value - 1;
    json_object *v = etcd_get(o, "value");
    if (v && etcd_bytes(v, (unsigned char *)kv->value, &vlen) == 0)
        kv->value[vlen] = '\0';
    else
        kv->value[0] = '\0';
    return 0;
}

enum etcd_kind etcd_key_kind(const char *tail, size_t len, uint32_t *limit)
{
    *limit = 0;
    if (len > 0 && tail[0] == 'r')
        return ETCD_READER;
    if (len < 3 || tail[0] != 's')
        return ETCD_WRITER;
    uint32_t n = 0;
    size_t i = 1;
    for (; i < len && i < 7 && tail[i] >= '0' && tail[i] <= '9'; i++)
        n = n * 10 + (uint32_t)(tail[i] - '0');
    if (i == 1 || i >= len || tail[i] != '-' || n == 0 || n > DLOCK_LIMIT_MAX)
        return ETCD_WRITER;
    *limit = n;
    return ETCD_PERMIT;
}

/* Whether a watch event counts (struct etcd_stream: any, before). */
static int event_counts(const struct etcd_stream *w, json_object *e)
{
    json_object *t = etcd_get(e, "type");
    int del = t && json_object_is_type(t, json_type_string) &&
              strcmp(json_object_get_string(t), "DELETE") == 0;
    if (w->any)
        return 1;
    if (!del)
        return 0;
    json_object *prev = etcd_get(e, "prev_kv");
    /* Without its previous key (compacted), it may be one before ours. */
    return !w->before || !prev || etcd_int(prev, "create_revision") < w->before;
}

static void stream_line(struct etcd_stream *w, const char *line)
{
    json_object *root = json_tokener_parse(line);
    json_object *res = etcd_get(root, "result"), *ev;
    if (res && etcd_get(res, "created") && json_object_get_boolean(etcd_get(res, "created")))
        w->created = 1;
    if (!res) {
        json_object *e = etcd_get(root, "error");
        json_object *m = e ? etcd_get(e, "message") : NULL;
        const char *text = m && json_object_is_type(m, json_type_string)
                               ? json_object_get_string(m) : NULL;
        snprintf(w->why, sizeof w->why, "%s",
                 text && text[0] ? text : e ? "an error without a message" : "an unreadable reply");
        w->done = 2;
    } else if ((ev = etcd_get(res, "events")) && json_object_is_type(ev, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(ev); i++)
            if (event_counts(w, json_object_array_get_idx(ev, i)))
                w->done = 1;
    } else if (etcd_get(res, "canceled") && json_object_get_boolean(etcd_get(res, "canceled"))) {
        w->compact = etcd_int(res, "compact_revision");
        snprintf(w->why, sizeof w->why, "the watch was cancelled%s",
                 w->compact ? ": its revision was compacted" : "");
        w->done = 2;
    }
    json_object_put(root);
}

int etcd_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

size_t etcd_stream_feed(struct etcd_stream *w, const char *data, size_t len)
{
    if (w->done)
        return len;
    if (etcd_append(&w->buf, &w->len, &w->cap, data, len) != 0)
        return 0;
    char *nl;
    while (!w->done && (nl = memchr(w->buf, '\n', w->len)) != NULL) {
        *nl = '\0';
        stream_line(w, w->buf);
        size_t used = (size_t)(nl + 1 - w->buf);
        memmove(w->buf, nl + 1, w->len - used + 1);
        w->len -= used;
    }
    return len;
}

void etcd_stream_free(struct etcd_stream *w)
{
    free(w->buf);
    memset(w, 0, sizeof *w);
}
