/*
 * The native half of the Node.js package: libdlock's calls run off the
 * main thread, each client's in order, and come back as promises.
 *
 * Design
 *   Loading. The addon does not link libdlock: load(path) dlopen()s it and
 *   takes every function it uses with dlsym(), once per process. So the
 *   JS loader decides which library is used (DLOCK_LIBRARY, else the one
 *   pkg-config named at build time, else the system loader's search) and
 *   a missing library is an error naming the path instead of a failed
 *   require() with a loader message. Only dlock.h's types and constants
 *   come from the headers pkg-config found.
 *
 *   Threads. libdlock wants one client's calls serialised, and a wait can
 *   last as long as a lock is held, so every client has its own worker
 *   thread (not the libuv pool, where a few long waits would starve fs and
 *   dns) with a FIFO queue of jobs. The worker runs each job and hands it
 *   back through the client's thread-safe function, whose callback on the
 *   main thread settles the job's promise (within a callback scope, so
 *   promise reactions run at once). The thread-safe function is referenced
 *   only while a job is pending: an idle client does not keep the process
 *   alive. The JS object is referenced too while a job is pending, so its
 *   finalizer never races a reply.
 *
 *   Locks. The worker keeps every held dlock_lock in a table keyed by a
 *   64-bit id; JS only ever sees ids, so a release after close() (which
 *   frees the handles) is an error, never a use after free. A reentrant
 *   acquire that returns a handle already in the table returns its id.
 *
 *   Loss. Kept locks report loss through on_lost on a keeper thread; the
 *   callback looks the handle up (under the table's mutex) and queues a
 *   "lost" message on the same thread-safe function, which calls the JS
 *   dispatch function given at construction. A loss can come before the
 *   worker has filed the lock (even inside dlock_acquire_n()): on_lost
 *   then finds nothing, and the worker, which files the lock and queues the
 *   acquire's reply in one critical section, sees dlock_lock_lost() and
 *   queues the message itself, right after the reply. A flag per lock, set
 *   under the mutex, makes it one message whoever sends it. on_lost is
 *   never called after dlock_release() or dlock_client_close() return, and
 *   the worker releases the thread-safe function only after close, so it
 *   is alive whenever the keeper uses it.
 *
 *   Cancel. A Cancel object owns a dlock_cancel shared with the job that
 *   uses it; fire() raises it from the main thread (dlock_cancel_fire() is
 *   safe from any thread), and the flag (an eventfd) is freed when both are
 *   done: the JS side close()s it when the acquire settles, as a loop of
 *   waits would run out of descriptors long before GC freed them. A fire()
 *   after close() does nothing. The JS side fires it on the AbortSignal's
 *   abort and on close().
 *
 *   A client collected without close() is closed on its worker (its locks
 *   released there); the worker then ends. Nothing joins the workers: a
 *   process that exits with a call in flight leaves the stores to drop the
 *   connection. The environment's teardown (process exit) finalizes the
 *   thread-safe functions and collects every client, so a worker may
 *   finish a job after its thread-safe function is gone: the finalizer
 *   marks the core (tsfn_gone, under its mutex), and the worker and the
 *   keeper check the mark, under the same mutex, before every call on it.
 */
#include <napi.h>

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <dlock.h>
#include <uv.h>

namespace {

/* Every libdlock function the addon calls. */
#define DLOCK_NODE_FUNCS(X)                                                    \
    X(dlock_strerror)                                                          \
    X(dlock_err_name)                                                          \
    X(dlock_version)                                                           \
    X(dlock_monotonic_ns)                                                      \
    X(dlock_client_open)                                                       \
    X(dlock_client_close)                                                      \
    X(dlock_errmsg)                                                            \
    X(dlock_client_backend)                                                    \
    X(dlock_client_caps)                                                       \
    X(dlock_acquire_n)                                                         \
    X(dlock_release)                                                           \
    X(dlock_renew)                                                             \
    X(dlock_lock_token)                                                        \
    X(dlock_lock_holds)                                                        \
    X(dlock_lock_lost)                                                         \
    X(dlock_lock_lost_detail)                                                  \
    X(dlock_inspect_holders)                                                   \
    X(dlock_cancel_new)                                                        \
    X(dlock_cancel_fire)                                                       \
    X(dlock_cancel_free)

/* Elections: a libdlock without them still loads, and their calls reject
 * with DLOCK_ENOTSUP (has_elections). */
#define DLOCK_NODE_ELECTION_FUNCS(X)                                           \
    X(dlock_campaign)                                                          \
    X(dlock_proclaim)                                                          \
    X(dlock_resign)                                                            \
    X(dlock_leader)                                                            \
    X(dlock_observe)                                                           \
    X(dlock_observer_fd)                                                       \
    X(dlock_observer_next)                                                     \
    X(dlock_observer_close)

struct Lib {
    void *handle = nullptr;
    std::string path;
    bool has_elections = false;
#define DLOCK_NODE_PTR_(f) decltype(&::f) f = nullptr;
    DLOCK_NODE_FUNCS(DLOCK_NODE_PTR_)
    DLOCK_NODE_ELECTION_FUNCS(DLOCK_NODE_PTR_)
#undef DLOCK_NODE_PTR_
};

/* Loaded once per process, shared by every environment (worker_threads
 * included); written only under lib_mu before `loaded` is set. */
Lib lib;
std::mutex lib_mu;
bool loaded = false;

struct CancelFlag {
    dlock_cancel *flag = nullptr;
    ~CancelFlag() { lib.dlock_cancel_free(flag); }
};

/* A lock the worker holds, by handle. */
struct Held {
    uint64_t id;
    /* Its loss went to JS already (under Core::mu): reported once. */
    bool lost_reported;
};

enum class Kind {
    Open, Acquire, Release, Renew, Close, Lost, Holders,
    Campaign, Proclaim, Resign, Leader, Observe
};

struct Job {
    Kind kind;
    /* Inputs. */
    std::string str; /* URI or lock name */
    std::string value; /* Campaign, Proclaim: the leader's value (bytes) */
    dlock_acquire_opts opts = DLOCK_ACQUIRE_OPTS_INIT;
    uint32_t ttl = 0;
    uint64_t id = 0;
    std::shared_ptr<CancelFlag> cancel;
    /* Outputs. */
    int rc = 0;
    dlock_lock *lock = nullptr; /* granted, until the worker files it */
    std::string detail;
    std::string backend;
    unsigned int caps = 0;
    uint64_t token = 0;
    unsigned int holds = 0;
    std::vector<dlock_holder> holders; /* Holders: those that fit */
    size_t count = 0;                  /* Holders: how many hold */
    std::unique_ptr<dlock_leader_info> leader; /* Leader */
    dlock_observer *observer = nullptr;        /* Observe: until JS takes it */
    /* Main thread only. */
    std::unique_ptr<Napi::Promise::Deferred> deferred;
    struct Core *core = nullptr;
    explicit Job(Kind k) : kind(k) {}
    /* An observer nobody took (its reply never reached JS). */
    ~Job() { if (observer) lib.dlock_observer_close(observer); }
};

class ClientWrap;

struct Core {
    /* The queue, and the lock table that on_lost reads from keeper threads. */
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job *> queue;
    std::unordered_map<uint64_t, dlock_lock *> locks;
    std::unordered_map<dlock_lock *, Held> held;
    uint64_t next_id = 1;
    /* The cancel flag of the acquire the worker is in, if any. */
    std::shared_ptr<CancelFlag> running_cancel;
    /* Set, under mu, when the thread-safe function is finalized: by the
     * worker's release after close, or by the environment's teardown
     * (process exit), which may come first. */
    bool tsfn_gone = false;
    Napi::ThreadSafeFunction tsfn;
    /* Worker only. */
    dlock_client *client = nullptr;
    /* Main thread only. */
    ClientWrap *wrap = nullptr;
    unsigned int pending = 0;
    bool closing = false;
};

void on_complete(Napi::Env env, Napi::Function dispatch, Job *job);

/* Hands a job to the main thread; false once the environment is gone (the
 * thread-safe function is then freed, or about to be). Called with core->mu
 * held, which the thread-safe function's finalizer takes to say so. */
bool reply(Core *core, Job *job)
{
    return !core->tsfn_gone && core->tsfn.NonBlockingCall(job, on_complete) == napi_ok;
}

void on_lost(dlock_lock *lock, int err, void *user)
{
    Core *core = static_cast<Core *>(user);
    Job *job = new Job(Kind::Lost);
    job->rc = err;
    job->detail = lib.dlock_lock_lost_detail(lock);
    std::lock_guard<std::mutex> g(core->mu);
    auto it = core->held.find(lock);
    /* Not filed yet (the acquire has not returned, or its worker has not
     * got the mutex): file_lock() reports it. */
    if (it == core->held.end() || it->second.lost_reported) {
        delete job;
        return;
    }
    it->second.lost_reported = true;
    job->id = it->second.id;
    if (!reply(core, job))
        delete job;
}

/* Files a granted lock under an id, and returns the report of a loss that
 * on_lost dropped because it came before. Called with core->mu held, in the
 * critical section that queues the acquire's reply: on_lost either ran
 * before (the lock is lost already, and reported here once) or runs after
 * that reply, so JS always has the Lock when a loss arrives. */
Job *file_lock(Core *core, Job *job)
{
    auto it = core->held.find(job->lock);
    if (it != core->held.end()) { /* reentrant: filed at its first grant */
        job->id = it->second.id;
        return nullptr;
    }
    job->id = core->next_id++;
    core->locks[job->id] = job->lock;
    int lost = lib.dlock_lock_lost(job->lock);
    core->held[job->lock] = Held{job->id, lost != 0};
    if (lost == 0)
        return nullptr;
    Job *report = new Job(Kind::Lost);
    report->rc = lost;
    report->detail = lib.dlock_lock_lost_detail(job->lock);
    report->id = job->id;
    return report;
}

/* The lock filed under job->id, or nullptr (with the job's error) once it
 * is released. */
dlock_lock *find_lock(Core *core, Job *job)
{
    {
        std::lock_guard<std::mutex> g(core->mu);
        auto it = core->locks.find(job->id);
        if (it != core->locks.end())
            return it->second;
    }
    job->rc = DLOCK_EINVAL;
    job->detail = "the lock was already released";
    return nullptr;
}

/* A call of the election API on a libdlock that has none. */
bool no_elections(Job *job)
{
    if (lib.has_elections)
        return false;
    job->rc = DLOCK_ENOTSUP;
    job->detail = "the libdlock at " + lib.path + " has no elections (too old for them)";
    return true;
}

void run_job(Core *core, Job *job)
{
    if ((job->kind == Kind::Campaign || job->kind == Kind::Proclaim ||
         job->kind == Kind::Leader || job->kind == Kind::Observe) &&
        no_elections(job))
        return;
    switch (job->kind) {
    case Kind::Open:
        job->rc = lib.dlock_client_open(job->str.c_str(), &core->client);
        if (job->rc == 0) {
            job->backend = lib.dlock_client_backend(core->client);
            job->caps = lib.dlock_client_caps(core->client);
        }
        break;
    case Kind::Acquire:
    case Kind::Campaign: {
        if (job->kind == Kind::Campaign)
            job->opts.keep = 1; /* as dlock_campaign() takes it */
        job->opts.on_lost = job->opts.keep ? on_lost : nullptr;
        job->opts.on_lost_user = core;
        job->opts.cancel = job->cancel ? job->cancel->flag : nullptr;
        {
            std::lock_guard<std::mutex> g(core->mu);
            core->running_cancel = job->cancel;
        }
        if (job->kind == Kind::Campaign)
            job->rc = lib.dlock_campaign(core->client, job->str.c_str(), job->value.data(),
                                         job->value.size(), &job->opts, &job->lock);
        else
            job->rc = lib.dlock_acquire_n(core->client, job->str.data(), job->str.size(),
                                          &job->opts, &job->lock);
        {
            std::lock_guard<std::mutex> g(core->mu);
            core->running_cancel.reset();
        }
        if (job->rc == 0) {
            job->token = lib.dlock_lock_token(job->lock);
            job->holds = lib.dlock_lock_holds(job->lock);
        }
        break;
    }
    case Kind::Release:
    case Kind::Resign:
    case Kind::Renew: {
        dlock_lock *lock = find_lock(core, job);
        if (!lock)
            return;
        if (job->kind == Kind::Renew) {
            job->rc = lib.dlock_renew(lock, job->ttl);
            job->holds = lib.dlock_lock_holds(lock);
            break;
        }
        /* A lock held more than once stays allocated: count first. */
        unsigned int holds = lib.dlock_lock_holds(lock);
        if (holds <= 1) {
            /* Out of the table before the handle is freed, so on_lost
             * (which cannot run past dlock_release) never finds a stale one. */
            std::lock_guard<std::mutex> g(core->mu);
            core->locks.erase(job->id);
            core->held.erase(lock);
        }
        /* A leadership is never held twice: resign is its release. */
        job->rc = job->kind == Kind::Resign && lib.has_elections ? lib.dlock_resign(lock)
                                                                 : lib.dlock_release(lock);
        job->holds = holds <= 1 ? 0 : holds - 1;
        break;
    }
    case Kind::Proclaim: {
        dlock_lock *lock = find_lock(core, job);
        if (!lock)
            return;
        job->rc = lib.dlock_proclaim(lock, job->value.data(), job->value.size());
        break;
    }
    case Kind::Leader:
        job->leader = std::make_unique<dlock_leader_info>();
        job->rc = lib.dlock_leader(core->client, job->str.c_str(), job->leader.get());
        break;
    case Kind::Observe:
        job->rc = lib.dlock_observe(core->client, job->str.c_str(), nullptr, nullptr,
                                    &job->observer);
        break;
    case Kind::Holders:
        /* Room for those the last answer counted: holders come and go
         * between calls, so a few tries, then those that fit. */
        job->holders.resize(8);
        for (int tries = 0;; tries++) {
            job->rc = lib.dlock_inspect_holders(core->client, job->str.c_str(),
                                                job->holders.data(), job->holders.size(),
                                                &job->count);
            if (job->rc != 0 || job->count <= job->holders.size() || tries == 3)
                break;
            job->holders.resize(job->count);
        }
        if (job->rc == 0 && job->count < job->holders.size())
            job->holders.resize(job->count);
        break;
    case Kind::Close:
        lib.dlock_client_close(core->client);
        core->client = nullptr;
        {
            std::lock_guard<std::mutex> g(core->mu);
            core->locks.clear();
            core->held.clear();
        }
        break;
    case Kind::Lost:
        break;
    }
    if (job->rc != 0) {
        const char *m = lib.dlock_errmsg(core->client);
        job->detail = m && *m ? m : lib.dlock_strerror(job->rc);
    }
}

void worker_main(std::shared_ptr<Core> core)
{
    for (;;) {
        Job *job;
        {
            std::unique_lock<std::mutex> g(core->mu);
            core->cv.wait(g, [&] { return !core->queue.empty(); });
            job = core->queue.front();
            core->queue.pop_front();
        }
        run_job(core.get(), job);
        /* A failed open leaves a client that only carries the detail:
         * close it, and this worker is done. */
        bool last = job->kind == Kind::Close || (job->kind == Kind::Open && job->rc != 0);
        if (job->kind == Kind::Open && job->rc != 0) {
            lib.dlock_client_close(core->client);
            core->client = nullptr;
        }
        std::lock_guard<std::mutex> g(core->mu);
        Job *lost = (job->kind == Kind::Acquire || job->kind == Kind::Campaign) && job->rc == 0
                        ? file_lock(core.get(), job)
                        : nullptr;
        if (!reply(core.get(), job))
            delete job;
        if (lost && !reply(core.get(), lost))
            delete lost;
        if (last) {
            if (!core->tsfn_gone)
                core->tsfn.Release();
            break;
        }
    }
}

Napi::Object error_object(Napi::Env env, const Job *job)
{
    Napi::Object e = Napi::Object::New(env);
    e.Set("errno", Napi::Number::New(env, job->rc));
    e.Set("code", Napi::String::New(env, lib.dlock_err_name(job->rc)));
    e.Set("detail", Napi::String::New(env, job->detail));
    e.Set("holds", Napi::Number::New(env, job->holds));
    return e;
}

Napi::Object caps_object(Napi::Env env, unsigned int caps)
{
    /* Bits of DLOCK_CAP_* (dlock_backend.h; numbers are ABI). */
    static const char *const names[] = {"lease",    "renew",       "fencing", "fifo",
                                        "blocking", "shared",      "deadline",
                                        "holderDeath", "raise",    "cancel",
                                        "semaphore", "election",   "watch"};
    Napi::Object o = Napi::Object::New(env);
    for (unsigned int i = 0; i < sizeof names / sizeof names[0]; i++)
        o.Set(names[i], Napi::Boolean::New(env, (caps >> i) & 1u));
    return o;
}

/* The holders as objects with the fields the store filled (the others
 * absent: unknown, never zero). */
Napi::Array holders_array(Napi::Env env, const std::vector<dlock_holder> &hs)
{
    Napi::Array a = Napi::Array::New(env, hs.size());
    for (size_t i = 0; i < hs.size(); i++) {
        const dlock_holder &h = hs[i];
        Napi::Object o = Napi::Object::New(env);
        if (h.known & DLOCK_KNOWS_MODE) {
            o.Set("mode", Napi::String::New(env, h.mode == DLOCK_MODE_SHARED ? "shared"
                                                                              : "exclusive"));
            o.Set("limit", Napi::Number::New(env, h.limit));
        }
        if (h.known & DLOCK_KNOWS_TOKEN)
            o.Set("token", Napi::BigInt::New(env, h.token));
        if (h.known & DLOCK_KNOWS_OWNER)
            o.Set("owner", Napi::String::New(env, std::string(h.owner, strnlen(h.owner,
                                                                      sizeof h.owner))));
        if (h.known & DLOCK_KNOWS_LEASE)
            o.Set("leaseMs", Napi::Number::New(env, static_cast<double>(h.lease_ms)));
        a.Set(static_cast<uint32_t>(i), o);
    }
    return a;
}

/* A dlock_leader_info as {name, held, value (Buffer), term (bigint),
 * leaseMs, owner (null: unknown)}, and for an observer that could not read
 * the store, error: {errno, code, detail} (the rest as last known). */
Napi::Object leader_object(Napi::Env env, const std::string &name, const dlock_leader_info &l)
{
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", Napi::String::New(env, name));
    o.Set("held", Napi::Boolean::New(env, l.held != 0));
    size_t vlen = l.value_len <= DLOCK_VALUE_MAX ? l.value_len : 0;
    o.Set("value", Napi::Buffer<char>::Copy(env, l.err ? "" : l.value, l.err ? 0 : vlen));
    o.Set("term", Napi::BigInt::New(env, static_cast<uint64_t>(l.term)));
    o.Set("leaseMs", l.held && (l.known & DLOCK_KNOWS_LEASE)
                         ? Napi::Value(Napi::Number::New(env, static_cast<double>(l.lease_ms)))
                         : env.Null());
    o.Set("owner", l.held && (l.known & DLOCK_KNOWS_OWNER)
                       ? Napi::Value(Napi::String::New(
                             env, std::string(l.owner, strnlen(l.owner, sizeof l.owner))))
                       : env.Null());
    if (l.err) {
        Napi::Object e = Napi::Object::New(env);
        e.Set("errno", Napi::Number::New(env, l.err));
        e.Set("code", Napi::String::New(env, lib.dlock_err_name(l.err)));
        e.Set("detail", Napi::String::New(env, std::string(l.value, vlen)));
        o.Set("error", e);
    }
    return o;
}

/* An observer handed from the worker to JS: closed at GC unless an
 * ObserverWrap took it. */
struct ObserverBox {
    dlock_observer *observer;
    std::string name;
};

/*
 * An election's observer on the event loop: a uv_poll on
 * dlock_observer_fd() (readable while changes are queued) drains the queue
 * with dlock_observer_next() without waiting, and hands each change to the
 * JS function given at construction. JS polls only while someone wants
 * changes (resume(), pause()): meanwhile they wait in libdlock's queue (the
 * last DLOCK_OBSERVE_QUEUE). A polled observer holds a reference to its
 * object (its callbacks need it) and keeps the loop alive unless unref()ed;
 * a paused one that JS drops is closed when collected. close() stops the
 * poll, then closes the observer (which joins its thread) on a thread of
 * its own, never blocking the loop for the observer's read in flight.
 */
class ObserverWrap : public Napi::ObjectWrap<ObserverWrap> {
public:
    static Napi::Function Init(Napi::Env env)
    {
        return DefineClass(env, "Observer",
                           {InstanceMethod<&ObserverWrap::Close>("close"),
                            InstanceMethod<&ObserverWrap::Resume>("resume"),
                            InstanceMethod<&ObserverWrap::Pause>("pause"),
                            InstanceMethod<&ObserverWrap::SetRef>("ref")});
    }

    /* new Observer(box, onChange) */
    explicit ObserverWrap(const Napi::CallbackInfo &info) : Napi::ObjectWrap<ObserverWrap>(info)
    {
        Napi::Env env = info.Env();
        if (info.Length() < 2 || !info[0].IsExternal() || !info[1].IsFunction())
            throw Napi::TypeError::New(env, "Observer(box, onChange) expected");
        ObserverBox *box = info[0].As<Napi::External<ObserverBox>>().Data();
        if (!box->observer)
            throw Napi::TypeError::New(env, "the observer was taken already");
        uv_loop_t *loop = nullptr;
        if (napi_get_uv_event_loop(env, &loop) != napi_ok || !loop)
            throw Napi::Error::New(env, "no event loop");
        poll = new uv_poll_t;
        int rc = uv_poll_init(loop, poll, lib.dlock_observer_fd(box->observer));
        if (rc != 0) {
            delete poll;
            poll = nullptr;
            throw Napi::Error::New(env, std::string("cannot poll an observer: ") + uv_strerror(rc));
        }
        observer = box->observer;
        box->observer = nullptr;
        name = box->name;
        poll->data = this;
        on_change = Napi::Persistent(info[1].As<Napi::Function>());
    }

    ~ObserverWrap() override
    {
        /* Open: dropped by JS while paused, or the environment's teardown
         * (polled maybe: uv_close() stops the poll, and the object's own
         * reference is going anyway). */
        polling = false;
        stop();
        lib.dlock_observer_close(observer);
    }

private:
    static void on_readable(uv_poll_t *h, int status, int)
    {
        ObserverWrap *self = static_cast<ObserverWrap *>(h->data);
        Napi::Env env = self->Env();
        Napi::HandleScope scope(env);
        Napi::Object keep = self->Value(); /* alive through a close() below */
        /* Errors of the poll itself: the queue is read anyway. */
        (void)status;
        dlock_leader_info l;
        while (self->polling && lib.dlock_observer_next(self->observer, &l, 0) == 0) {
            Napi::Object change = leader_object(env, self->name, l);
            /* Within a callback scope, so that promise reactions (an async
             * iterator's) run at once; an exception is the process's
             * uncaught one, as from any event listener. */
            napi_async_context ctx = nullptr;
            napi_async_init(env, keep, Napi::String::New(env, "dlock.Observer"), &ctx);
            try {
                self->on_change.MakeCallback(keep, {change}, ctx);
            } catch (const Napi::Error &e) {
                napi_async_destroy(env, ctx);
                napi_fatal_exception(env, e.Value());
                return;
            }
            napi_async_destroy(env, ctx);
        }
    }

    /* Stops polling for good; the descriptor stays open (the observer
     * owns it). */
    void stop()
    {
        if (!poll)
            return;
        pause();
        uv_close(reinterpret_cast<uv_handle_t *>(poll),
                 [](uv_handle_t *h) { delete reinterpret_cast<uv_poll_t *>(h); });
        poll = nullptr;
    }

    void pause()
    {
        if (!polling)
            return;
        uv_poll_stop(poll);
        polling = false;
        Unref();
    }

    Napi::Value Resume(const Napi::CallbackInfo &info)
    {
        if (poll && !polling) {
            int rc = uv_poll_start(poll, UV_READABLE, on_readable);
            if (rc != 0)
                throw Napi::Error::New(info.Env(),
                                       std::string("cannot poll an observer: ") + uv_strerror(rc));
            polling = true;
            Ref();
        }
        return info.Env().Undefined();
    }

    Napi::Value Pause(const Napi::CallbackInfo &info)
    {
        pause();
        return info.Env().Undefined();
    }

    Napi::Value Close(const Napi::CallbackInfo &info)
    {
        if (poll) {
            stop();
            dlock_observer *o = observer;
            observer = nullptr;
            std::thread([o] { lib.dlock_observer_close(o); }).detach();
        }
        return info.Env().Undefined();
    }

    /* ref(true|false): whether the polled observer keeps the loop alive. */
    Napi::Value SetRef(const Napi::CallbackInfo &info)
    {
        if (poll) {
            if (info.Length() > 0 && info[0].ToBoolean())
                uv_ref(reinterpret_cast<uv_handle_t *>(poll));
            else
                uv_unref(reinterpret_cast<uv_handle_t *>(poll));
        }
        return info.Env().Undefined();
    }

    dlock_observer *observer = nullptr;
    uv_poll_t *poll = nullptr;
    bool polling = false;
    std::string name;
    Napi::FunctionReference on_change;
};

class CancelWrap : public Napi::ObjectWrap<CancelWrap> {
public:
    static Napi::Function Init(Napi::Env env)
    {
        return DefineClass(env, "Cancel",
                           {InstanceMethod<&CancelWrap::Fire>("fire"),
                            InstanceMethod<&CancelWrap::Close>("close")});
    }
    explicit CancelWrap(const Napi::CallbackInfo &info) : Napi::ObjectWrap<CancelWrap>(info)
    {
        flag = std::make_shared<CancelFlag>();
        int rc = lib.dlock_cancel_new(&flag->flag);
        if (rc != 0)
            throw Napi::Error::New(info.Env(), std::string("dlock_cancel_new: ") +
                                                   lib.dlock_strerror(rc));
    }
    /* After close(), nothing: an abort that comes late is harmless. */
    Napi::Value Fire(const Napi::CallbackInfo &info)
    {
        if (flag)
            lib.dlock_cancel_fire(flag->flag);
        return info.Env().Undefined();
    }
    /* Gives up the flag (an eventfd) now rather than at GC, which is late
     * enough to run out of descriptors; a job still using it keeps it. */
    Napi::Value Close(const Napi::CallbackInfo &info)
    {
        flag.reset();
        return info.Env().Undefined();
    }
    std::shared_ptr<CancelFlag> flag;
};

struct Addon {
    Napi::FunctionReference cancel_ctor;
};

class ClientWrap : public Napi::ObjectWrap<ClientWrap> {
public:
    static Napi::Function Init(Napi::Env env)
    {
        return DefineClass(env, "Client",
                           {InstanceMethod<&ClientWrap::Open>("open"),
                            InstanceMethod<&ClientWrap::Acquire>("acquire"),
                            InstanceMethod<&ClientWrap::Release>("release"),
                            InstanceMethod<&ClientWrap::Renew>("renew"),
                            InstanceMethod<&ClientWrap::Holders>("inspectHolders"),
                            InstanceMethod<&ClientWrap::Campaign>("campaign"),
                            InstanceMethod<&ClientWrap::Proclaim>("proclaim"),
                            InstanceMethod<&ClientWrap::Leader>("leader"),
                            InstanceMethod<&ClientWrap::Observe>("observe"),
                            InstanceMethod<&ClientWrap::Close>("close")});
    }

    /* new Client(dispatch): dispatch(id, errno, code, detail) is called on
     * the main thread when a kept lock is lost. */
    explicit ClientWrap(const Napi::CallbackInfo &info) : Napi::ObjectWrap<ClientWrap>(info)
    {
        Napi::Env env = info.Env();
        if (!loaded)
            throw Napi::Error::New(env, "libdlock is not loaded");
        if (info.Length() < 1 || !info[0].IsFunction())
            throw Napi::TypeError::New(env, "dispatch function expected");
        core = std::make_shared<Core>();
        core->wrap = this;
        core->tsfn = Napi::ThreadSafeFunction::New(
            env, info[0].As<Napi::Function>(), "dlock", 0, 1,
            [](Napi::Env, std::shared_ptr<Core> *hold) {
                {
                    std::lock_guard<std::mutex> g((*hold)->mu);
                    (*hold)->tsfn_gone = true;
                }
                delete hold;
            },
            new std::shared_ptr<Core>(core));
        core->tsfn.Unref(env);
        std::thread(worker_main, core).detach();
    }

    ~ClientWrap() override
    {
        /* Collected: no job is pending (they hold a reference). Close on
         * the worker unless close() or a failed open ended it already. */
        core->wrap = nullptr;
        if (!core->closing)
            push(new Job(Kind::Close));
        /* Only the environment's teardown (a worker thread terminated, the
         * process exiting) collects a client with waits in flight: end
         * those that can be cancelled, so the close behind them runs. */
        std::lock_guard<std::mutex> g(core->mu);
        if (core->running_cancel)
            lib.dlock_cancel_fire(core->running_cancel->flag);
        for (Job *job : core->queue)
            if (job->cancel)
                lib.dlock_cancel_fire(job->cancel->flag);
    }

    /* Called by on_complete for a job that had a promise. */
    void done()
    {
        if (--core->pending == 0) {
            core->tsfn.Unref(Env());
            Unref();
        }
    }

    std::shared_ptr<Core> core;

private:
    /* lib/index.js checks too, with the option's name; this keeps a wrong
     * caller from wrapping around 2^32. */
    static uint32_t ttl_arg(const Napi::Value &v)
    {
        double ttl = v.As<Napi::Number>().DoubleValue();
        if (!(ttl >= 1 && ttl <= UINT32_MAX) || ttl != std::floor(ttl))
            throw Napi::TypeError::New(v.Env(), "ttl must be an integer number of milliseconds, "
                                                "1 to 4294967295");
        return static_cast<uint32_t>(ttl);
    }

    void push(Job *job)
    {
        {
            std::lock_guard<std::mutex> g(core->mu);
            core->queue.push_back(job);
        }
        core->cv.notify_one();
    }

    Napi::Value submit(Napi::Env env, Job *job)
    {
        if (core->closing) {
            Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
            job->rc = DLOCK_EINVAL;
            job->detail = "the client is closed";
            d.Reject(error_object(env, job));
            delete job;
            return d.Promise();
        }
        job->deferred = std::make_unique<Napi::Promise::Deferred>(Napi::Promise::Deferred::New(env));
        job->core = core.get();
        Napi::Value p = job->deferred->Promise();
        if (core->pending++ == 0) {
            core->tsfn.Ref(env);
            Ref();
        }
        if (job->kind == Kind::Close)
            core->closing = true;
        push(job);
        return p;
    }

    Napi::Value Open(const Napi::CallbackInfo &info)
    {
        Job *job = new Job(Kind::Open);
        job->str = info[0].As<Napi::String>().Utf8Value();
        return submit(info.Env(), job);
    }

    /* The bytes of a Buffer (or any Uint8Array). */
    static std::string bytes_arg(const Napi::Value &v)
    {
        if (!v.IsTypedArray())
            throw Napi::TypeError::New(v.Env(), "a Buffer expected");
        Napi::Uint8Array a = v.As<Napi::Uint8Array>();
        return std::string(reinterpret_cast<const char *>(a.Data()), a.ByteLength());
    }

    /* ttl, wait, relMs and cancel|null at info[at..at+3] into job->opts. */
    static void wait_args(const Napi::CallbackInfo &info, size_t at, Job *job,
                          size_t cancel_at)
    {
        Napi::Env env = info.Env();
        job->opts.ttl_ms = ttl_arg(info[at]);
        job->opts.wait = static_cast<dlock_wait>(info[at + 1].As<Napi::Number>().Int32Value());
        if (job->opts.wait == DLOCK_WAIT_DEADLINE) {
            /* The deadline counts from the call, not from when the worker
             * gets to it behind this client's other calls. */
            double ns = info[at + 2].As<Napi::Number>().DoubleValue() * 1e6;
            if (std::isnan(ns))
                throw Napi::TypeError::New(env, "the wait must be a number of milliseconds");
            uint64_t now = lib.dlock_monotonic_ns();
            /* 2^63 ns is 292 years: a wait past that never ends, and the
             * deadline would not fit (the conversion is undefined past 2^64). */
            if (ns >= 9223372036854775808.0)
                job->opts.wait = DLOCK_WAIT_FOREVER;
            else
                job->opts.deadline_ns = ns <= 0 ? now : now + static_cast<uint64_t>(ns);
        }
        if (info.Length() > cancel_at && info[cancel_at].IsObject()) {
            Napi::Object o = info[cancel_at].As<Napi::Object>();
            Addon *addon = env.GetInstanceData<Addon>();
            if (!o.InstanceOf(addon->cancel_ctor.Value()))
                throw Napi::TypeError::New(env, "Cancel expected");
            job->cancel = CancelWrap::Unwrap(o)->flag;
            if (!job->cancel)
                throw Napi::TypeError::New(env, "the Cancel is closed");
        }
    }

    /* campaign(name, value: Buffer, ttl, wait, relMs, cancel|null) */
    Napi::Value Campaign(const Napi::CallbackInfo &info)
    {
        auto job = std::make_unique<Job>(Kind::Campaign);
        job->str = info[0].As<Napi::String>().Utf8Value();
        job->value = bytes_arg(info[1]);
        wait_args(info, 2, job.get(), 5);
        return submit(info.Env(), job.release());
    }

    /* proclaim(id, value: Buffer) */
    Napi::Value Proclaim(const Napi::CallbackInfo &info)
    {
        auto job = std::make_unique<Job>(Kind::Proclaim);
        job->id = static_cast<uint64_t>(info[0].As<Napi::Number>().Int64Value());
        job->value = bytes_arg(info[1]);
        return submit(info.Env(), job.release());
    }

    /* leader(name): {name, held, value, term, leaseMs, owner} */
    Napi::Value Leader(const Napi::CallbackInfo &info)
    {
        Job *job = new Job(Kind::Leader);
        job->str = info[0].As<Napi::String>().Utf8Value();
        return submit(info.Env(), job);
    }

    /* observe(name): an External for new Observer() */
    Napi::Value Observe(const Napi::CallbackInfo &info)
    {
        Job *job = new Job(Kind::Observe);
        job->str = info[0].As<Napi::String>().Utf8Value();
        return submit(info.Env(), job);
    }

    /* acquire(name, ttl, wait, relMs, keep, reentrant, cancel|null, shared, limit) */
    Napi::Value Acquire(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        auto job = std::make_unique<Job>(Kind::Acquire);
        job->str = info[0].As<Napi::String>().Utf8Value();
        wait_args(info, 1, job.get(), 6);
        job->opts.keep = info[4].ToBoolean() ? 1 : 0;
        job->opts.reentrant = info[5].ToBoolean() ? 1 : 0;
        job->opts.mode = info.Length() > 7 && info[7].ToBoolean() ? DLOCK_MODE_SHARED
                                                                  : DLOCK_MODE_EXCLUSIVE;
        if (info.Length() > 8 && info[8].IsNumber()) {
            /* lib/index.js checks the range with the option's name; this
             * keeps a wrong caller from wrapping around 2^32. */
            double limit = info[8].As<Napi::Number>().DoubleValue();
            if (!(limit >= 0 && limit <= DLOCK_LIMIT_MAX) || limit != std::floor(limit))
                throw Napi::TypeError::New(env, "limit must be an integer, 1 to 65535");
            job->opts.limit = static_cast<uint32_t>(limit);
        }
        return submit(env, job.release());
    }

    /* inspectHolders(name): [{mode, limit, token, owner, leaseMs}] */
    Napi::Value Holders(const Napi::CallbackInfo &info)
    {
        Job *job = new Job(Kind::Holders);
        job->str = info[0].As<Napi::String>().Utf8Value();
        return submit(info.Env(), job);
    }

    /* release(id, resign) */
    Napi::Value Release(const Napi::CallbackInfo &info)
    {
        Job *job = new Job(info.Length() > 1 && info[1].ToBoolean() ? Kind::Resign
                                                                    : Kind::Release);
        job->id = static_cast<uint64_t>(info[0].As<Napi::Number>().Int64Value());
        return submit(info.Env(), job);
    }

    Napi::Value Renew(const Napi::CallbackInfo &info)
    {
        uint32_t ttl = ttl_arg(info[1]);
        Job *job = new Job(Kind::Renew);
        job->id = static_cast<uint64_t>(info[0].As<Napi::Number>().Int64Value());
        job->ttl = ttl;
        return submit(info.Env(), job);
    }

    Napi::Value Close(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        if (core->closing) {
            Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
            d.Resolve(env.Undefined());
            return d.Promise();
        }
        return submit(env, new Job(Kind::Close));
    }
};

void on_complete(Napi::Env env, Napi::Function dispatch, Job *job)
{
    std::unique_ptr<Job> owned(job);
    if (env == nullptr)
        return;
    if (job->kind == Kind::Lost) {
        dispatch.Call({Napi::Number::New(env, static_cast<double>(job->id)),
                       Napi::Number::New(env, job->rc),
                       Napi::String::New(env, lib.dlock_err_name(job->rc)),
                       Napi::String::New(env, job->detail)});
        return;
    }
    if (!job->deferred)
        return; /* the close of a collected client */
    Napi::Value result = env.Undefined();
    if (job->rc != 0) {
        result = error_object(env, job);
    } else if (job->kind == Kind::Open) {
        Napi::Object o = Napi::Object::New(env);
        o.Set("backend", Napi::String::New(env, job->backend));
        o.Set("caps", caps_object(env, job->caps));
        result = o;
    } else if (job->kind == Kind::Acquire || job->kind == Kind::Campaign) {
        Napi::Object o = Napi::Object::New(env);
        o.Set("id", Napi::Number::New(env, static_cast<double>(job->id)));
        o.Set("token", Napi::BigInt::New(env, job->token));
        o.Set("holds", Napi::Number::New(env, job->holds));
        result = o;
    } else if (job->kind == Kind::Release || job->kind == Kind::Resign ||
               job->kind == Kind::Renew) {
        result = Napi::Number::New(env, job->holds);
    } else if (job->kind == Kind::Holders) {
        result = holders_array(env, job->holders);
    } else if (job->kind == Kind::Leader) {
        result = leader_object(env, job->str, *job->leader);
    } else if (job->kind == Kind::Observe) {
        result = Napi::External<ObserverBox>::New(
            env, new ObserverBox{job->observer, job->str}, [](Napi::Env, ObserverBox *box) {
                lib.dlock_observer_close(box->observer);
                delete box;
            });
        job->observer = nullptr;
    }
    /* A failed open ended the worker: later calls are refused. */
    if (job->kind == Kind::Open && job->rc != 0)
        job->core->closing = true;
    /* Bookkeeping before settling, so that a reaction calling again sees
     * the right pending count. */
    job->core->wrap->done();
    if (job->rc == 0)
        job->deferred->Resolve(result);
    else
        job->deferred->Reject(result);
}

Napi::Value Load(const Napi::CallbackInfo &info)
{
    Napi::Env env = info.Env();
    std::string path = info[0].As<Napi::String>().Utf8Value();
    std::lock_guard<std::mutex> g(lib_mu);
    if (loaded)
        return Napi::String::New(env, lib.path); /* another environment did */
    dlerror();
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        throw Napi::Error::New(env, std::string("cannot load libdlock: ") + (e ? e : path));
    }
    Lib l;
    l.handle = h;
#define DLOCK_NODE_SYM_(f)                                                              \
    l.f = reinterpret_cast<decltype(&::f)>(dlsym(h, #f));                               \
    if (!l.f) {                                                                         \
        dlclose(h);                                                                     \
        throw Napi::Error::New(env, "cannot load libdlock: " + path + " has no " #f     \
                                    " (too old for this package)");                     \
    }
    DLOCK_NODE_FUNCS(DLOCK_NODE_SYM_)
#undef DLOCK_NODE_SYM_
    l.has_elections = true;
#define DLOCK_NODE_OPT_(f)                                                              \
    l.f = reinterpret_cast<decltype(&::f)>(dlsym(h, #f));                               \
    l.has_elections = l.has_elections && l.f;
    DLOCK_NODE_ELECTION_FUNCS(DLOCK_NODE_OPT_)
#undef DLOCK_NODE_OPT_
    char real[4096];
    /* The file actually mapped, for dlock.library. */
    Dl_info di;
    if (dladdr(reinterpret_cast<void *>(l.dlock_version), &di) && di.dli_fname &&
        realpath(di.dli_fname, real))
        l.path = real;
    else
        l.path = path;
    lib = l;
    loaded = true;
    return Napi::String::New(env, lib.path);
}

Napi::Value Version(const Napi::CallbackInfo &info)
{
    return Napi::String::New(info.Env(), lib.dlock_version());
}

Napi::Value Strerror(const Napi::CallbackInfo &info)
{
    return Napi::String::New(info.Env(), lib.dlock_strerror(info[0].As<Napi::Number>().Int32Value()));
}

Napi::Object Init(Napi::Env env, Napi::Object exports)
{
    Addon *addon = new Addon;
    Napi::Function cancel = CancelWrap::Init(env);
    addon->cancel_ctor = Napi::Persistent(cancel);
    env.SetInstanceData(addon);
    exports.Set("Cancel", cancel);
    exports.Set("Client", ClientWrap::Init(env));
    exports.Set("Observer", ObserverWrap::Init(env));
    exports.Set("load", Napi::Function::New(env, Load));
    exports.Set("version", Napi::Function::New(env, Version));
    exports.Set("strerror", Napi::Function::New(env, Strerror));
    /* The error table, from the header this was built with. */
    Napi::Object codes = Napi::Object::New(env);
#define DLOCK_NODE_CODE_(name, num, text) codes.Set("DLOCK_" #name, Napi::Number::New(env, num));
    DLOCK_ERRNO_MAP(DLOCK_NODE_CODE_)
#undef DLOCK_NODE_CODE_
    exports.Set("codes", codes);
    return exports;
}

} // namespace

NODE_API_MODULE(dlock, Init)
