/* etcd's JSON and base64: see etcd_json.h. Pure: no I/O. */
#include "backends/etcd_json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_object *etcd_get(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v))
        return v;
    return NULL;
}

int64_t etcd_int(json_object *o, const char *key)
{
    json_object *v = etcd_get(o, key);
    if (!v)
        return 0;
    if (json_object_is_type(v, json_type_string))
        return strtoll(json_object_get_string(v), NULL, 10);
    return json_object_get_int64(v);
}

json_object *etcd_new_int(int64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%" PRId64, v);
    return json_object_new_string(b);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json_object *etcd_new_bytes(const void *data, size_t len)
{
    const unsigned char *p = data;
    size_t n = (len + 2) / 3 * 4;
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < len ? p[i + 2] : 0);
        *o++ = b64[v >> 18 & 63];
        *o++ = b64[v >> 12 & 63];
        *o++ = i + 1 < len ? b64[v >> 6 & 63] : '=';
        *o++ = i + 2 < len ? b64[v & 63] : '=';
    }
    json_object *s = json_object_new_string_len(out, (int)n);
    free(out);
    return s;
}

int etcd_bytes(json_object *str, unsigned char *out, size_t *len)
{
    if (!str || !json_object_is_type(str, json_type_string))
        return -1;
    const char *s = json_object_get_string(str);
    size_t n = (size_t)json_object_get_string_len(str), k = 0;
    unsigned v = 0;
    int bits = 0;
    for (size_t i = 0; i < n && s[i] != '='; i++) {
        const char *q = strchr(b64, s[i]);
        if (!q || !s[i])
            return -1;
        v = v << 6 | (unsigned)(q - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (k >= *len)
                return -1;
            out[k++] = (unsigned char)(v >> bits);
        }
    }
    *len = k;
    return 0;
}

int etcd_body_ok(const char *body)
{
    return body && !strstr(body, ":null") && !strstr(body, ",null") && !strstr(body, "[null");
}
