/*
 * etcd's JSON and base64 (backends/etcd_json.c): the members of a reply,
 * int64s as the gateway writes them, keys and values as base64, and the
 * check that a request is whole. Pure: no connection, no client; below
 * both the gateway (etcd_http.c) and the replies' reader (etcd_reply.c).
 */
#ifndef DLOCK_ETCD_JSON_H
#define DLOCK_ETCD_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

/* Reading replies: a member by name (NULL when o is not an object or has
 * none), an int64 (the gateway writes them as strings; 0 when absent). */
json_object *etcd_get(json_object *o, const char *key);
int64_t etcd_int(json_object *o, const char *key);
/* A JSON string holding an int64 (how the gateway takes them). */
json_object *etcd_new_int(int64_t v);

/* Base64 (etcd's keys and values are bytes): the encoding of len bytes as
 * a new JSON string; the decoding of a JSON string into out (room for
 * *len bytes; *len set to what it holds). -1 on bad input or no room. */
json_object *etcd_new_bytes(const void *data, size_t len);
int etcd_bytes(json_object *str, unsigned char *out, size_t *len);

/* Whether a request's JSON is whole: a builder that ran out of memory
 * leaves a null (json-c adds NULL as null), and no request of dlock's has
 * one (base64, hex and words hold no ':' ',' '['). */
int etcd_body_ok(const char *body);

#endif
