'use strict';
// dlock for Node.js: a promise API over libdlock. Every blocking call runs
// on the client's own worker thread (src/dlock_node.cc); this file turns
// options into the C ones, errors into DlockError, and keeps the Lock
// objects. See README.md for units, threading, cancel and loss.
const { EventEmitter } = require('node:events');
const native = require('./native');

const codes = Object.freeze({ ...native.codes });
const WAIT_TRY = 0, WAIT_DEADLINE = 1, WAIT_FOREVER = 2;
const TTL_MAX = 0xffffffff;
const LIMIT_MAX = 65535;
const VALUE_MAX = 1024; // DLOCK_VALUE_MAX: a leader's value, bytes

class DlockError extends Error {
  constructor(code, errno, message) {
    super(message);
    this.name = 'DlockError';
    this.code = code;
    this.errno = errno;
  }
}

// Native rejections are plain {errno, code, detail, holds} objects.
function toError(e) {
  if (e && typeof e === 'object' && !(e instanceof Error) && typeof e.errno === 'number')
    return new DlockError(e.code, e.errno, e.detail || native.strerror(e.errno));
  return e;
}

function invalid(message) {
  return new DlockError('DLOCK_EINVAL', codes.DLOCK_EINVAL, message);
}

// A bad option's value, for its error.
function show(v) {
  if (typeof v === 'number') return String(v);
  if (typeof v === 'string') return `'${v}'`;
  if (v instanceof Date) return 'an invalid Date';
  return v === null ? 'null' : `a value of type ${typeof v}`;
}

function checkTtl(ttl, what) {
  if (!Number.isInteger(ttl) || ttl <= 0 || ttl > TTL_MAX)
    throw new TypeError(`${what} must be an integer number of milliseconds, 1 to ${TTL_MAX}, ` +
                        `not ${show(ttl)}`);
  return ttl;
}

// A semaphore's limit: undefined (a read-write lock) or 1 to LIMIT_MAX.
function limitOf(opts) {
  const { limit } = opts;
  if (limit === undefined) return 0;
  if (!Number.isInteger(limit) || limit < 1 || limit > LIMIT_MAX)
    throw new TypeError(`limit must be an integer from 1 to ${LIMIT_MAX}, not ${show(limit)}`);
  return limit;
}

// -> [ttl, wait mode, deadline in ms from now]. A deadline too far for
// libdlock's clock (past 2^63 ns, 292 years) is a wait forever: the addon
// turns it into one.
function waitOf(opts) {
  const ttl = opts.ttl === undefined ? 30000 : checkTtl(opts.ttl, 'ttl');
  const { wait, deadline } = opts;
  if (deadline !== undefined) {
    if (wait !== undefined && wait !== 'deadline')
      throw new TypeError("deadline cannot be combined with wait (other than 'deadline')");
    const at = deadline instanceof Date ? deadline.getTime() : deadline;
    if (typeof at !== 'number' || !Number.isFinite(at))
      throw new TypeError('deadline must be a valid Date or a finite number of milliseconds ' +
                          `since the epoch, not ${show(deadline)}`);
    return [ttl, WAIT_DEADLINE, at - Date.now()];
  }
  if (wait === undefined || wait === 'forever') return [ttl, WAIT_FOREVER, 0];
  if (wait === 'try') return [ttl, WAIT_TRY, 0];
  if (typeof wait === 'number' && wait >= 0 && Number.isFinite(wait))
    return [ttl, WAIT_DEADLINE, wait];
  throw new TypeError("wait must be 'try', 'forever' or a finite number of milliseconds >= 0, " +
                      `not ${show(wait)}`);
}

// A leader's value: a Buffer (or any Uint8Array) as is, a string as UTF-8.
// The length is libdlock's to check (DLOCK_EINVAL over VALUE_MAX bytes).
function valueOf(value) {
  if (value === undefined) return Buffer.alloc(0);
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  if (value instanceof Uint8Array) return value;
  throw new TypeError(`value must be a Buffer, a Uint8Array or a string, not ${show(value)}`);
}

// An election's name reaches libdlock as a C string.
function checkElectionName(name) {
  if (typeof name !== 'string')
    throw new TypeError('name must be a string');
  if (name.includes('\0'))
    throw invalid('an election name cannot contain a NUL character');
}

// A leader as the addon reads it: an observer's read error as a DlockError.
function toLeader(r) {
  if (r.error) r.error = toError(r.error);
  return r;
}

class Lock extends EventEmitter {
  #client;
  #id;
  #name;
  #token;
  #lost = null;
  #released = false;
  #shared;
  #limit;

  constructor(client, id, name, token, shared, limit) {
    super();
    this.#client = client;
    this.#id = id;
    this.#name = name;
    this.#token = token;
    this.#shared = shared;
    this.#limit = limit;
  }

  /** Fencing token (bigint): above every earlier grant of the name. */
  get token() { return this.#token; }
  get name() { return this.#name; }
  /** 'exclusive' or 'shared', as acquired. */
  get mode() { return this.#shared ? 'shared' : 'exclusive'; }
  /** The semaphore's limit; 0 for a read-write lock. */
  get limit() { return this.#limit; }
  get client() { return this.#client; }
  /** null, or 'DLOCK_ELOST' / 'DLOCK_EEXPIRED' once a kept lock is lost. */
  get lost() { return this.#lost; }
  get released() { return this.#released; }

  async release() { return this.#client._release(this, this.#id); }

  async renew(ttl) {
    checkTtl(ttl, 'ttl');
    return this.#client._renew(this, this.#id, ttl);
  }

  _setReleased() { this.#released = true; }

  _id() { return this.#id; }

  _setLost(code, err) {
    if (this.#lost !== null) return;
    this.#lost = code;
    this.emit('lost', err);
  }
}

/** A won election: a kept lock (a 'lost' event, .lost) whose token is the
 * term, publishing a value until it resigns. */
class Leadership extends Lock {
  #value;

  constructor(client, id, name, token, value) {
    super(client, id, name, token, false, 0);
    this.#value = Buffer.from(value);
  }

  /** The term (bigint): the grant's fencing token, above every earlier
   * leader's. */
  get term() { return this.token; }
  /** The value published (a Buffer). */
  get value() { return this.#value; }

  /** Publishes a new value while still leading (DLOCK_ELOST otherwise). */
  async proclaim(value) {
    const v = valueOf(value);
    await this.client._proclaim(this, this._id(), v);
    this.#value = Buffer.from(v);
  }

  /** Gives up leadership: the next candidate leads at once. */
  async resign() { return this.client._release(this, this._id(), true); }

  async release() { return this.resign(); }
}

// Observers polled now, kept from GC: their native callbacks find them
// through a WeakRef, so that one nobody polls or holds can be collected
// (and its libdlock observer closed).
const polled = new Set();

// Made outside the Observer's constructor, whose scope (closed over by its
// listeners) holds the observer itself.
function deliverTo(weak) {
  return (change) => weak.deref()?._deliver(change);
}

/**
 * An election's observer: each change of leader (the current state first)
 * as a 'change' event and through async iteration, in order. A change is
 * {name, held, value, term, leaseMs, owner}; one with .error (a
 * DlockError) says the observer could not read the store (the other
 * fields as last known) and keeps trying. Changes are read from libdlock
 * while a 'change' listener or an iteration wants them; until then they
 * wait in its queue (the last 64). close() ends it; so does leaving a
 * for-await loop. A polled observer keeps the process alive (unref()).
 */
class Observer extends EventEmitter {
  #native;
  #name;
  #closed = false;
  #polling = false;
  #waiting = 0; // iterations waiting for a change
  #iterators = new Set(); // each iteration's push function

  constructor(box, name) {
    super();
    this.#name = name;
    this.#native = new native.Observer(box, deliverTo(new WeakRef(this)));
    this.on('newListener', (event) => { if (event === 'change') this.#want(true); });
    this.on('removeListener', (event) => { if (event === 'change') this.#want(false); });
  }

  get name() { return this.#name; }
  get closed() { return this.#closed; }

  // Polls while changes are wanted (a listener is being added: adding).
  #want(adding) {
    if (this.#closed) return;
    const want = adding || this.listenerCount('change') > 0 || this.#waiting > 0;
    if (want && !this.#polling) {
      this.#polling = true;
      polled.add(this);
      this.#native.resume();
    } else if (!want && this.#polling) {
      this.#polling = false;
      polled.delete(this);
      this.#native.pause();
    }
  }

  _deliver(change) {
    toLeader(change);
    for (const push of this.#iterators) push(change);
    this.emit('change', change);
  }

  /** Stops observing; pending iterations end. Closing again does nothing. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#polling = false;
    polled.delete(this);
    this.#native.close();
    this.emit('close');
  }

  /** Whether the polled observer keeps the event loop (the process) alive. */
  ref() { this.#native.ref(true); return this; }
  unref() { this.#native.ref(false); return this; }

  [Symbol.asyncIterator]() {
    const queue = []; // changes not asked for yet
    const waiting = []; // next() calls waiting for a change
    let done = this.#closed;
    const settle = (r) => {
      this.#waiting--;
      waiting.shift()(r);
      this.#want(false);
    };
    const push = (change) => {
      if (waiting.length) settle({ value: change, done: false });
      else queue.push(change);
    };
    const finish = () => {
      if (done) return;
      done = true;
      this.#iterators.delete(push);
      this.off('close', finish);
      while (waiting.length) settle({ value: undefined, done: true });
    };
    if (!done) {
      this.#iterators.add(push);
      this.once('close', finish);
    }
    const it = {
      next: () => {
        if (queue.length) return Promise.resolve({ value: queue.shift(), done: false });
        if (done) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => {
          waiting.push(resolve);
          this.#waiting++;
          this.#want(false);
        });
      },
      // Leaving a for-await loop (break, return, throw) closes the observer.
      return: () => {
        finish();
        this.close();
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() { return it; },
    };
    return it;
  }
}

class Client {
  #native;
  #locks = new Map(); // id -> Lock: held until release() or close()
  #waits = new Set(); // cancel flags of the acquires in flight
  #closed = false;

  constructor(nativeClient, info) {
    this.#native = nativeClient;
    this.backend = info.backend;
    this.caps = Object.freeze(info.caps);
  }

  get closed() { return this.#closed; }

  async acquire(name, opts = {}) {
    if (typeof name !== 'string')
      throw new TypeError('name must be a string');
    if (opts === null || typeof opts !== 'object')
      throw new TypeError('options must be an object');
    const [ttl, mode, rel] = waitOf(opts);
    const limit = limitOf(opts);
    const shared = !!opts.shared;
    const signal = opts.signal;
    const r = await this.#wait(signal, mode, (cancel) =>
      this.#native.acquire(name, ttl, mode, rel, !!opts.keep, !!opts.reentrant, cancel, shared,
                           limit));
    let lock = this.#locks.get(r.id);
    if (!lock) {
      lock = new Lock(this, r.id, name, r.token, shared, limit);
      this.#locks.set(r.id, lock);
    }
    return lock;
  }

  /** Waits for call(cancel) to grant: signal aborts it, close() ends it. */
  async #wait(signal, mode, call) {
    if (signal !== undefined && !(signal instanceof AbortSignal))
      throw new TypeError('signal must be an AbortSignal');
    if (signal?.aborted) throw signal.reason;
    if (this.#closed) throw invalid('the client is closed');
    // A wait gets a cancel flag when it has a signal, and also on a
    // backend that can cancel, so that close() can end it.
    let cancel = null;
    const onAbort = () => cancel.fire();
    if (signal || (mode !== WAIT_TRY && this.caps.cancel)) {
      cancel = new native.Cancel();
      this.#waits.add(cancel);
      signal?.addEventListener('abort', onAbort, { once: true });
    }
    try {
      return await call(cancel);
    } catch (e) {
      if (e && e.errno === codes.DLOCK_ECANCELED) {
        if (signal?.aborted) throw signal.reason;
        if (this.#closed) throw new DlockError('DLOCK_ECANCELED', e.errno,
                                               'the client was closed during the wait');
      }
      throw toError(e);
    } finally {
      signal?.removeEventListener('abort', onAbort);
      if (cancel) {
        this.#waits.delete(cancel);
        // Its eventfd now, not at GC: a loop of waits would pile them up.
        // A fire() after this does nothing.
        cancel.close();
      }
    }
  }

  /** Campaigns for the election name until this client leads (as acquire
   * waits: wait, deadline, signal; ttl), publishing value (Buffer or
   * string, at most 1024 bytes): a Leadership, kept until it resigns. */
  async campaign(name, opts = {}) {
    checkElectionName(name);
    if (opts === null || typeof opts !== 'object')
      throw new TypeError('options must be an object');
    const [ttl, mode, rel] = waitOf(opts);
    const value = valueOf(opts.value);
    const r = await this.#wait(opts.signal, mode, (cancel) =>
      this.#native.campaign(name, value, ttl, mode, rel, cancel));
    const leadership = new Leadership(this, r.id, name, r.token, value);
    this.#locks.set(r.id, leadership);
    return leadership;
  }

  /** Who leads the election name, without campaigning: {name, held,
   * value (Buffer), term (bigint; 0n: none), leaseMs, owner}. */
  async leader(name) {
    checkElectionName(name);
    if (this.#closed) throw invalid('the client is closed');
    try {
      return toLeader(await this.#native.leader(name));
    } catch (e) {
      throw toError(e);
    }
  }

  /** Starts observing the election name: an Observer (events and async
   * iteration), with a thread and a connection of its own; it may
   * outlive this client. */
  async observe(name) {
    checkElectionName(name);
    if (this.#closed) throw invalid('the client is closed');
    let box;
    try {
      box = await this.#native.observe(name);
    } catch (e) {
      throw toError(e);
    }
    return new Observer(box, name);
  }

  async _proclaim(lock, id, value) {
    if (lock.released) throw invalid('the leadership was resigned');
    try {
      await this.#native.proclaim(id, value);
    } catch (e) {
      const err = toError(e);
      if (err.errno === codes.DLOCK_ELOST) lock._setLost('DLOCK_ELOST', err);
      throw err;
    }
  }

  /** Every holder of name, in grant order, without taking it: objects
   * with the fields the store filled (mode, limit, token, owner, leaseMs). */
  async inspectHolders(name) {
    if (typeof name !== 'string')
      throw new TypeError('name must be a string');
    if (this.#closed) throw invalid('the client is closed');
    try {
      return await this.#native.inspectHolders(name);
    } catch (e) {
      throw toError(e);
    }
  }

  async withLock(name, opts, fn) {
    if (typeof opts === 'function') [opts, fn] = [{}, opts];
    if (typeof fn !== 'function') throw new TypeError('withLock needs a function');
    const lock = await this.acquire(name, opts);
    let result;
    try {
      result = await fn(lock);
    } catch (e) {
      if (!lock.released) await lock.release().catch(() => {});
      throw e;
    }
    // A release that fails (DLOCK_ELOST: the lease ran out during fn) is
    // reported: what fn did may not have been protected.
    if (!lock.released) await lock.release();
    return result;
  }

  async _release(lock, id, resign = false) {
    if (lock.released) throw invalid('the lock was already released');
    let holds;
    try {
      holds = await this.#native.release(id, resign);
    } catch (e) {
      if (e && e.holds === 0) this.#forget(id, lock);
      const err = toError(e);
      if (err.errno === codes.DLOCK_ELOST) lock._setLost('DLOCK_ELOST', err);
      throw err;
    }
    if (holds === 0) this.#forget(id, lock);
  }

  async _renew(lock, id, ttl) {
    if (lock.released) throw invalid('the lock was already released');
    try {
      await this.#native.renew(id, ttl);
    } catch (e) {
      const err = toError(e);
      if (err.errno === codes.DLOCK_ELOST) lock._setLost('DLOCK_ELOST', err);
      throw err;
    }
  }

  #forget(id, lock) {
    this.#locks.delete(id);
    lock._setReleased();
  }

  _lost(id, errno, code, detail) {
    const lock = this.#locks.get(id);
    if (lock) lock._setLost(code, new DlockError(code, errno, detail || native.strerror(errno)));
  }

  /** Releases every lock still held and ends the client's thread. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    // Waits queued before the close would hold it back (forever, for
    // wait: 'forever'): they end with DLOCK_ECANCELED.
    for (const cancel of this.#waits) cancel.fire();
    try {
      await this.#native.close();
    } finally {
      for (const [id, lock] of this.#locks) this.#forget(id, lock);
    }
  }

}

// `await using` (TypeScript 5.2+, Node versions that parse it): a Lock is
// released, a Client closed. Only where the runtime has the symbol.
if (typeof Symbol.asyncDispose === 'symbol') {
  Object.defineProperty(Lock.prototype, Symbol.asyncDispose, {
    async value() { if (!this.released) await this.release(); },
    writable: true, configurable: true,
  });
  Object.defineProperty(Observer.prototype, Symbol.asyncDispose, {
    async value() { this.close(); },
    writable: true, configurable: true,
  });
  Object.defineProperty(Client.prototype, Symbol.asyncDispose, {
    async value() { await this.close(); },
    writable: true, configurable: true,
  });
}

async function open(uri) {
  if (typeof uri !== 'string') throw new TypeError('uri must be a string');
  // The native client keeps its dispatch function alive: it must not keep
  // the Client (which would then never be collected), hence the WeakRef.
  let weak = null;
  const n = new native.Client((id, errno, code, detail) => {
    weak?.deref()?._lost(id, errno, code, detail);
  });
  let info;
  try {
    info = await n.open(uri);
  } catch (e) {
    throw toError(e);
  }
  const client = new Client(n, info);
  weak = new WeakRef(client);
  return client;
}

module.exports = {
  open,
  Client,
  Lock,
  Leadership,
  Observer,
  DlockError,
  codes,
  version: native.version(),
  library: native.library,
};
