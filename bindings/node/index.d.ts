// Type declarations of the dlock package (lib/index.js). Units: ttl and
// wait in milliseconds; deadline an absolute wall-clock time. See README.md.

import { EventEmitter } from 'node:events';

/** The error table of libdlock: name -> errno (negative). */
export declare const codes: Readonly<Record<DlockErrorCode, number>>;

export type DlockErrorCode =
  | 'DLOCK_EINVAL' | 'DLOCK_EBADURI' | 'DLOCK_ESCHEME' | 'DLOCK_ENOBACKEND'
  | 'DLOCK_ECONNECT' | 'DLOCK_EAUTH' | 'DLOCK_EBUSY' | 'DLOCK_ETIMEDOUT'
  | 'DLOCK_ELOST' | 'DLOCK_ENOTOWNER' | 'DLOCK_ENOTSUP' | 'DLOCK_EPROTO'
  | 'DLOCK_ENOMEM' | 'DLOCK_EIO' | 'DLOCK_EALREADY' | 'DLOCK_EDEADLK'
  | 'DLOCK_EINTR' | 'DLOCK_ESTORE' | 'DLOCK_EVERSION' | 'DLOCK_EEXIST'
  | 'DLOCK_EEXPIRED' | 'DLOCK_ECANCELED' | 'DLOCK_EMODE';

/** Version of the libdlock loaded, e.g. "0.1.0". */
export declare const version: string;
/** Path of the libdlock loaded (DLOCK_LIBRARY overrides it). */
export declare const library: string;

/** Every failure libdlock reports. */
export declare class DlockError extends Error {
  readonly name: 'DlockError';
  /** e.g. 'DLOCK_EBUSY' */
  readonly code: DlockErrorCode;
  /** e.g. -7 */
  readonly errno: number;
}

export interface Capabilities {
  readonly lease: boolean;
  readonly renew: boolean;
  readonly fencing: boolean;
  readonly fifo: boolean;
  readonly blocking: boolean;
  readonly shared: boolean;
  readonly deadline: boolean;
  readonly holderDeath: boolean;
  readonly raise: boolean;
  readonly cancel: boolean;
  readonly semaphore: boolean;
  /** Elections: campaign(), leader(), observe(). */
  readonly election: boolean;
  /** The store wakes observers (else they read it every 100 ms). */
  readonly watch: boolean;
}

export interface AcquireOptions {
  /** Lease in ms, an integer from 1 to 2^32-1 (default 30000); backends
   * without leases ignore it. Out of range: TypeError. */
  ttl?: number;
  /** 'try': one attempt (DLOCK_EBUSY); 'forever' (default); a finite number
   * >= 0: at most that many ms from the call, then DLOCK_ETIMEDOUT (more
   * than 2^63 ns away: forever). NaN, negative, Infinity: TypeError. */
  wait?: 'try' | 'forever' | number;
  /** Absolute end of the wait: a Date or ms since the epoch (Date.now());
   * more than 2^63 ns away: forever. Not with a wait other than 'deadline'. */
  deadline?: Date | number;
  /** The client's keeper renews (or checks) the lock until release. */
  keep?: boolean;
  /** Acquiring a name this client holds returns the same Lock, one more hold. */
  reentrant?: boolean;
  /** Aborting ends the wait: the promise rejects with signal.reason. */
  signal?: AbortSignal;
  /** A shared (read) lock: held together with other shared holders,
   * excluded by an exclusive one (DLOCK_ENOTSUP where the store has none). */
  shared?: boolean;
  /** A permit of the counting semaphore name: at most limit holders at once,
   * an integer from 1 to 65535 (else TypeError); not with shared
   * (DLOCK_EINVAL). A name held in another mode or with another limit
   * rejects at once with DLOCK_EMODE. */
  limit?: number;
}

/** One holder of a name (Client.inspectHolders()); a field the store
 * cannot tell is absent. */
export interface Holder {
  readonly mode?: 'exclusive' | 'shared';
  /** The name's limit: 0 for a read-write lock. */
  readonly limit?: number;
  readonly token?: bigint;
  /** The owner id (32 hex digits) where the store keeps it. */
  readonly owner?: string;
  /** Lease left, ms. */
  readonly leaseMs?: number;
}

export type LostCode = 'DLOCK_ELOST' | 'DLOCK_EEXPIRED';

export declare class Lock extends EventEmitter {
  protected constructor();
  /** Fencing token: above every earlier grant of the name on the store. */
  readonly token: bigint;
  readonly name: string;
  /** As acquired. */
  readonly mode: 'exclusive' | 'shared';
  /** The semaphore's limit; 0 for a read-write lock. */
  readonly limit: number;
  readonly client: Client;
  /** null, or why a kept lock was lost. */
  readonly lost: LostCode | null;
  /** true once released in the store (or by close()). */
  readonly released: boolean;
  release(): Promise<void>;
  /** Resets the lease to ttl ms from now (an integer from 1 to 2^32-1). */
  renew(ttl: number): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;

  on(event: 'lost', listener: (err: DlockError) => void): this;
  once(event: 'lost', listener: (err: DlockError) => void): this;
  off(event: 'lost', listener: (err: DlockError) => void): this;
  addListener(event: 'lost', listener: (err: DlockError) => void): this;
  removeListener(event: 'lost', listener: (err: DlockError) => void): this;
  emit(event: 'lost', err: DlockError): boolean;
}

/** A leader's value: bytes, or a string sent as UTF-8 (at most 1024 bytes). */
export type LeaderValue = Buffer | Uint8Array | string;

export interface CampaignOptions {
  /** Published while leading (default: empty). Over 1024 bytes: DLOCK_EINVAL. */
  value?: LeaderValue;
  /** Lease in ms, as AcquireOptions.ttl (leadership is always kept). */
  ttl?: number;
  /** As AcquireOptions.wait: 'try' (DLOCK_EBUSY while another leads),
   * 'forever' (default), or ms (then DLOCK_ETIMEDOUT). */
  wait?: 'try' | 'forever' | number;
  /** As AcquireOptions.deadline. */
  deadline?: Date | number;
  /** Aborting ends the campaign: the promise rejects with signal.reason. */
  signal?: AbortSignal;
}

/** Who leads an election (Client.leader(), an Observer's changes). */
export interface LeaderState {
  readonly name: string;
  /** Whether a leader exists. */
  readonly held: boolean;
  /** The leader's published value (empty: none, or not published yet). */
  readonly value: Buffer;
  /** The leader's term (its grant's fencing token); 0n without a leader. */
  readonly term: bigint;
  /** The leader's lease left when read, ms; null where unknown. */
  readonly leaseMs: number | null;
  /** The leader's owner id where the store keeps it; else null. */
  readonly owner: string | null;
  /** Observers only: the store could not be read (the other fields are as
   * last known); the observer keeps trying. */
  readonly error?: DlockError;
}

/** A won election: a kept Lock whose token is the term. */
export declare class Leadership extends Lock {
  private constructor();
  /** The term: the grant's fencing token, above every earlier leader's. */
  readonly term: bigint;
  /** The value published. */
  readonly value: Buffer;
  /** Publishes a new value while still leading (DLOCK_ELOST otherwise). */
  proclaim(value: LeaderValue): Promise<void>;
  /** Gives up leadership (release() does the same). */
  resign(): Promise<void>;
}

/** Each change of an election's leader, the current state first. */
export declare class Observer extends EventEmitter implements AsyncIterable<LeaderState> {
  private constructor();
  readonly name: string;
  readonly closed: boolean;
  /** Stops observing; iterations end. Idempotent. */
  close(): void;
  /** Keep the process alive while read (the default), or not. */
  ref(): this;
  unref(): this;
  /** Leaving the loop (break, return, throw) closes the observer. */
  [Symbol.asyncIterator](): AsyncIterator<LeaderState>;
  [Symbol.asyncDispose](): Promise<void>;

  on(event: 'change', listener: (change: LeaderState) => void): this;
  on(event: 'close', listener: () => void): this;
  once(event: 'change', listener: (change: LeaderState) => void): this;
  once(event: 'close', listener: () => void): this;
  off(event: 'change', listener: (change: LeaderState) => void): this;
  off(event: 'close', listener: () => void): this;
}

export declare class Client {
  private constructor();
  /** The backend's name, e.g. 'redis'. */
  readonly backend: string;
  readonly caps: Capabilities;
  readonly closed: boolean;
  acquire(name: string, opts?: AcquireOptions): Promise<Lock>;
  /** Every holder of name in grant order, without taking it. */
  inspectHolders(name: string): Promise<Holder[]>;
  /** Runs fn holding the lock; releases it whatever fn does. */
  withLock<T>(name: string, fn: (lock: Lock) => T | Promise<T>): Promise<T>;
  withLock<T>(name: string, opts: AcquireOptions,
              fn: (lock: Lock) => T | Promise<T>): Promise<T>;
  /** Campaigns for the election name until this client leads. */
  campaign(name: string, opts?: CampaignOptions): Promise<Leadership>;
  /** Who leads the election name, without campaigning. */
  leader(name: string): Promise<LeaderState>;
  /** Observes the election name (a thread and a connection of its own). */
  observe(name: string): Promise<Observer>;
  /** Releases every lock still held and ends the client's thread. */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Connects to the store named by uri ("redis://host:6379/0", "file:///dir"...). */
export declare function open(uri: string): Promise<Client>;
