// Compiled (not run) by test/types.test.js: index.d.ts must be valid and
// describe the API the way the README uses it.
import * as dlock from '../../index';

async function main(): Promise<bigint> {
  const client: dlock.Client = await dlock.open('file:///tmp/locks');
  const ac = new AbortController();
  const lock = await client.acquire('job', {
    ttl: 10_000, wait: 5000, keep: true, reentrant: false, signal: ac.signal,
  });
  lock.on('lost', (err: dlock.DlockError) => console.log(err.code, err.errno, err.message));
  const lost: 'DLOCK_ELOST' | 'DLOCK_EEXPIRED' | null = lock.lost;
  await lock.renew(20_000);
  const token: bigint = lock.token;
  await lock.release();
  await client.acquire('x', { wait: 'try' });
  await client.acquire('x', { deadline: new Date(Date.now() + 1000) });
  const n: number = await client.withLock('job', async (l) => Number(l.token));
  const s: string = await client.withLock('job', { wait: 'forever' }, () => 'done');
  const busy: number = dlock.codes.DLOCK_EBUSY;
  const reader = await client.acquire('report', { shared: true, wait: 'try' });
  const permit = await client.acquire('encoder', { limit: 3 });
  const mode: 'exclusive' | 'shared' = reader.mode;
  const limit: number = permit.limit;
  const holders: dlock.Holder[] = await client.inspectHolders('report');
  const first: bigint | undefined = holders[0]?.token;
  const emode: number = dlock.codes.DLOCK_EMODE;
  console.log(mode, limit, first, holders[0]?.leaseMs, emode, client.caps.semaphore);
  console.log(lost, n, s, busy, dlock.version, dlock.library, client.caps.cancel);
  const leading: dlock.Leadership = await client.campaign('scheduler', {
    value: 'host-a:8080', ttl: 10_000, wait: 5000, signal: ac.signal,
  });
  const term: bigint = leading.term;
  const published: Buffer = leading.value;
  leading.on('lost', (err: dlock.DlockError) => console.log(err.code));
  await leading.proclaim(Buffer.from('host-a:8081'));
  const now: dlock.LeaderState = await client.leader('scheduler');
  const leaseMs: number | null = now.leaseMs;
  const observer: dlock.Observer = await client.observe('scheduler');
  observer.on('change', (c: dlock.LeaderState) => console.log(c.held, c.term, c.error?.code));
  for await (const change of observer) {
    if (!change.held) break;
  }
  observer.unref().close();
  await leading.resign();
  console.log(term, published, now.value.toString(), now.owner, leaseMs, observer.closed);
  await client.close();
  return token;
}
void main;
