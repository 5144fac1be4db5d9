/*
 * Backends by scheme. Built-in backends are registered once (pthread_once);
 * applications may add their own with dlock_backend_register(). The table
 * is small and append-only, so lookups take a read lock only.
 */
#include <pthread.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "core/internal.h"

#define REGISTRY_MAX 32

static const dlock_backend *registry[REGISTRY_MAX];
static size_t registry_len;
static pthread_rwlock_t registry_lock = PTHREAD_RWLOCK_INITIALIZER;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static const dlock_backend *find_locked(const char *scheme)
{
    for (size_t i = 0; i < registry_len; i++)
        for (const char *const *s = registry[i]->schemes; *s; s++)
            if (strcasecmp(*s, scheme) == 0)
                return registry[i];
    return NULL;
}

static int check_backend(const dlock_backend *b)
{
    if (!b)
        return DLOCK_EINVAL;
    if (b->version == 0 || b->version > DLOCK_BACKEND_VERSION)
        return DLOCK_EVERSION;
    if (!b->name || !b->schemes || !b->schemes[0] || !b->options || !b->open ||
        !b->close || !b->acquire || !b->release)
        return DLOCK_EINVAL;
    return 0;
}

static int register_locked(const dlock_backend *b)
{
    int rc = check_backend(b);
    if (rc)
        return rc;
    for (const char *const *s = b->schemes; *s; s++)
        if (find_locked(*s))
            return DLOCK_EEXIST;
    if (registry_len == REGISTRY_MAX)
        return DLOCK_ENOMEM;
    registry[registry_len++] = b;
    return 0;
}

static void register_builtins(void)
{
    pthread_rwlock_wrlock(&registry_lock);
    register_locked(&dlock_file_backend);
#if HAVE_REDIS
    register_locked(&dlock_redis_backend);
#endif
#if HAVE_POSTGRES
    register_locked(&dlock_postgres_backend);
#endif
#if HAVE_MYSQL
    register_locked(&dlock_mysql_backend);
#endif
#if HAVE_ZOOKEEPER
    register_locked(&dlock_zookeeper_backend);
#endif
#if HAVE_ETCD
    register_locked(&dlock_etcd_backend);
#endif
    pthread_rwlock_unlock(&registry_lock);
}

void dlock_registry_init(void)
{
    pthread_once(&builtin_once, register_builtins);
}

int dlock_backend_register(const dlock_backend *backend)
{
    int rc;
    dlock_registry_init();
    pthread_rwlock_wrlock(&registry_lock);
    rc = register_locked(backend);
    pthread_rwlock_unlock(&registry_lock);
    return rc;
}

const dlock_backend *dlock_backend_find(const char *scheme)
{
    const dlock_backend *b;
    if (!scheme)
        return NULL;
    dlock_registry_init();
    pthread_rwlock_rdlock(&registry_lock);
    b = find_locked(scheme);
    pthread_rwlock_unlock(&registry_lock);
    return b;
}
