/*
 * The one Lua script behind every Redis lock operation, loaded once per
 * connection (SCRIPT LOAD) and called by SHA (EVALSHA, EVAL on NOSCRIPT).
 *
 * Keys:   KEYS[1] lock   (string "<owner>:<token>", PX lease)
 *         KEYS[2] fence  (integer counter, never expires)
 *         KEYS[3] queue  (list of waiting entries "<owner>|<ttl>|<channel>")
 *         KEYS[4] floor  (integer, "<prefix>floor": the store-wide floor of
 *                         raise_floor, never expires; missing means 0)
 *         KEYS[5] raised (below)
 *         KEYS[6] holders, KEYS[7] modes: shared holders and permits
 *                         (below, before the general code)
 * Every lock operation gets all seven keys (the floor call, one).
 * ARGV[1] is the operation:
 *   acquire owner ttl channel mode  → {1, token} granted, or {0, pttl}
 *                                     (mode "wait" queues the caller once),
 *                                     or {2, limit}: the name is held as a
 *                                     semaphore of that limit (DLOCK_EMODE)
 *   release owner                   → 1 released, 0 not ours (lost)
 *   renew   owner ttl               → 1 renewed,  0 not ours (lost)
 *   cancel  owner entry             → 1 it had been handed to us (now
 *                                     released again), 0 otherwise
 *   grab    owner ttl               → {1, token} or {0, pttl}: SET NX PX
 *                                     and the counter only, no queue (Redlock)
 *   fence   owner floor [mark]      → raises the counter to floor while
 *                                     the lock is ours (Redlock's write-back,
 *                                     raise_token), 1/0; never lowers it.
 *                                     With "mark" (raise_token, which passes
 *                                     KEYS[5]) a raise that moves the counter
 *                                     is recorded in KEYS[5] (see below)
 *   drop    owner channel           → like release, then PUBLISH channel
 *                                     (Redlock's wake-up for all waiters)
 *   floor   value                   → store-wide, called with the floor key
 *                                     alone (numkeys 1, KEYS[1] floor):
 *                                     floor = max(floor, value), 1
 *   sacquire owner ttl channel mode kind limit
 *                                   → a reader (kind "s", limit 0) or a
 *                                     permit (kind "p", limit N): {1, token},
 *                                     {0, ms to the earliest lease end}, or
 *                                     {2, the name's limit} held as another
 *                                     kind (0: a read-write lock)
 *   srelease, srenew, scancel, sgrab, sdrop: release, renew, cancel, grab
 *                                     and drop of a reader or permit
 *   holders listed                  → reads only: {how many hold, the
 *                                     name's limit, {the first `listed` by
 *                                     token: {owner, kind, token, lease ms}}}
 *   inspect listed [channel]        → reads only:
 *                                     {lock value or "", PTTL lock, counter
 *                                     or "", raised mark or "", live waiters,
 *                                     {their first `listed` owners, in queue
 *                                     order}, PUBSUB NUMSUB channel or -1,
 *                                     and with KEYS[8] its value or ""}
 *   publish owner seq value         → elections, with KEYS[8] ":leader":
 *                                     while the lock is ours, KEYS[8] =
 *                                     owner .. seq (16 hex digits) .. value,
 *                                     PUBLISH KEYS[8]; 1, or 0 not ours
 *   wake                            → PUBLISH KEYS[8] (after a release)
 *
 * KEYS[5] raised ("<prefix><name>:raised", only for fence with mark and
 * inspect): "<floor>:<previous>" when raise_token last moved the counter,
 * from <previous> to <floor>. A counter equal to <floor> was raised since
 * the last grant, whose token is <previous> (0: none); any other value is
 * the last grant's own (a grant always takes more than the counter). So
 * inspect tells the last token granted, never a raised floor. A raise on a
 * counter still equal to the mark's floor keeps the mark's <previous>.
 * Tokens are only drawn by a grant (the fast path checks the lock key
 * before it draws), so the counter skips no number.
 *
 * A release hands the lock straight to the first waiter that is still
 * subscribed to its channel (PUBSUB NUMSUB: a killed waiter's connection is
 * gone, so it is skipped) and publishes one message to that waiter alone:
 * first-come first-served, one message per handoff however many wait.
 * Every wait has a channel of its own (named after its owner id, fresh per
 * acquire), so an entry left behind by a wait that could not leave the
 * queue can never come alive again.
 * A lock found free with waiters queued (its holder died and the lease ran
 * out) is handed the same way before the caller may take it.
 *
 * The counter: every grant takes the largest of the counter + 1, the
 * server's clock, TIME in microseconds since the epoch (about 1.8e15 in
 * the late 2020s), and the store-wide floor + 1, and stores it back. (The
 * floor is read in the same script call, so no grant can miss a floor
 * raised before it started, for a name used before or never.) So a
 * counter that went back (a restart without persistence, an older RDB
 * snapshot or AOF tail after a crash, a promoted replica that lagged, an
 * evicted or deleted key) goes on above the tokens handed out before,
 * unless the server's clock is
 * behind the last token it handed out by more than the grants made since
 * (a clock set back, a new host whose clock is behind). Tokens still
 * strictly increase on one server whatever its clock does.
 * Lua numbers are doubles: exact up to 2^53 (about 9.007e15, the clock
 * reaches it in the year 2255), and a counter beyond that is refused.
 * Tokens are written into strings with %.0f: Lua's own number-to-string
 * conversion keeps 14 digits only.
 */
#ifndef DLOCK_BACKENDS_REDIS_SCRIPT_H
#define DLOCK_BACKENDS_REDIS_SCRIPT_H

/* The hot paths come first, in straight-line code: an uncontended
 * acquire (lock free, nobody queued), a release or renew by the owner with
 * nobody queued. The rest of the script creates a closure per helper on
 * every call, which costs the server about as much as the commands
 * themselves; these paths create none and call Redis the fewest times
 * (acquire: EXISTS, TIME, MGET, SET fence, SET lock), and the same for a
 * reader or permit on a free name and its release. Everything else,
 * and a fast path that finds the queue non-empty, falls through to the
 * general code below, whose grants draw their tokens with the same
 * fast_token(). */
#define DLOCK_REDIS_LUA(PUB, NUMSUB) \
    "local op, owner = ARGV[1], ARGV[2]\n" \
    "local function fast_token()\n" \
    "  local t = redis.call('TIME')\n" \
    "  local now = tonumber(t[1] .. string.sub('00000' .. t[2], -6))\n" \
    "  local v = redis.call('MGET', KEYS[2], KEYS[4])\n" \
    "  local token = tonumber(v[1] or '0') + 1\n" \
    "  local least = tonumber(v[2] or '0') + 1\n" \
    "  if least < now then least = now end\n" \
    "  if token < least then token = least end\n" \
    "  if token > 9007199254740991 then\n" \
    "    error({err = 'dlock: fence counter ' .. KEYS[2] .. ' is beyond 2^53'})\n" \
    "  end\n" \
    "  local s = string.format('%.0f', token)\n" \
    "  redis.call('SET', KEYS[2], s)\n" \
    "  return token, s, now\n" \
    "end\n" \
    "if op == 'acquire' then\n" \
    "  if redis.call('EXISTS', KEYS[3], KEYS[1]) == 0 then\n" \
    "    local token, s = fast_token()\n" \
    "    redis.call('SET', KEYS[1], owner .. ':' .. s, 'PX', ARGV[3])\n" \
    "    return {1, token}\n" \
    "  end\n" \
    "elseif op == 'release' or op == 'renew' then\n" \
    "  local v = redis.call('GET', KEYS[1])\n" \
    "  if not v or string.sub(v, 1, 32) ~= owner then return 0 end\n" \
    "  if op == 'renew' then\n" \
    "    redis.call('PEXPIRE', KEYS[1], ARGV[3])\n" \
    "    return 1\n" \
    "  end\n" \
    "  if redis.call('EXISTS', KEYS[3]) == 0 then\n" \
    "    redis.call('DEL', KEYS[1])\n" \
    "    return 1\n" \
    "  end\n" \
    /* A reader or permit (Redlock: a reader) on a free name, nobody \
     * queued (no lock key: nobody holds, whatever a holders key left \
     * behind says). */ \
    "elseif op == 'sacquire' or op == 'sgrab' then\n" \
    "  if redis.call('EXISTS', KEYS[3], KEYS[1]) == 0 then\n" \
    "    local token, s, now = fast_token()\n" \
    "    redis.call('DEL', KEYS[6], KEYS[7])\n" \
    "    redis.call('ZADD', KEYS[6], string.format('%.0f', math.floor(now / 1000) + tonumber(ARGV[3])), owner)\n" \
    "    redis.call('HSET', KEYS[7], owner, (ARGV[6] or 's') .. ':' .. s, 'limit', ARGV[7] or '0')\n" \
    "    redis.call('SET', KEYS[1], owner .. ':' .. s, 'PX', ARGV[3])\n" \
    "    return {1, token}\n" \
    "  end\n" \
    /* The only holder leaves, nobody queued, its lease not ended. */ \
    "elseif op == 'srelease' or op == 'sdrop' then\n" \
    "  if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('ZCARD', KEYS[6]) == 1 then\n" \
    "    local sc = redis.call('ZSCORE', KEYS[6], owner)\n" \
    "    local t = redis.call('TIME')\n" \
    "    if sc and tonumber(sc) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) and\n" \
    "       redis.call('EXISTS', KEYS[1]) == 1 then\n" \
    "      redis.call('DEL', KEYS[1], KEYS[6], KEYS[7])\n" \
    "      if op == 'sdrop' then redis.call('" PUB "', ARGV[3], 'released') end\n" \
    "      return 1\n" \
    "    end\n" \
    "  end\n" \
    "end\n" \
    "if op == 'floor' then\n" \
    "  local floor = tonumber(ARGV[2])\n" \
    "  if not floor then return redis.error_reply('dlock: bad floor') end\n" \
    "  if tonumber(redis.call('GET', KEYS[1]) or '0') < floor then\n" \
    "    redis.call('SET', KEYS[1], ARGV[2])\n" \
    "  end\n" \
    "  return 1\n" \
    "end\n" \
    "local lock, fence, queue, floorkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n" \
    "local function str(n) return string.format('%.0f', n) end\n" \
    "local function grant(o, ttl)\n" \
    "  local token, s = fast_token()\n" \
    "  redis.call('SET', lock, o .. ':' .. s, 'PX', ttl)\n" \
    "  return token\n" \
    "end\n" \
    "local function ours()\n" \
    "  local v = redis.call('GET', lock)\n" \
    "  if v and string.sub(v, 1, 32) == owner then\n" \
    "    return tonumber(string.sub(v, 34))\n" \
    "  end\n" \
    "  return nil\n" \
    "end\n" \
    /* Shared holders and permits: KEYS[6] a sorted set of owners scored \
     * by lease end (the server's ms), KEYS[7] a hash owner -> \
     * "<s|p>:<token>" and "limit" -> the name's limit (0: read-write). \
     * While any holds, the lock key exists (the "mirror": the newest \
     * holder's "<owner>:<token>", PX the longest lease), so that an \
     * exclusive request, of this release or an older one, sees it held. */ \
    "local holders, modes = KEYS[6], KEYS[7]\n" \
    "local NOW\n" \
    "local function now_ms()\n" \
    "  if not NOW then\n" \
    "    local t = redis.call('TIME')\n" \
    "    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
    "  end\n" \
    "  return NOW\n" \
    "end\n" \
    "local function token_of(m) return tonumber(string.match(m or '', '^%a:(%d+)$') or '') end\n" \
    /* The mirror again, from the holders: deleted when none is left. */ \
    "local function mirror()\n" \
    "  local top = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')\n" \
    "  local all, best, bt = redis.call('HGETALL', modes), nil, -1\n" \
    "  for i = 1, #all, 2 do\n" \
    "    local t = token_of(all[i + 1])\n" \
    "    if t and t > bt then best, bt = all[i], t end\n" \
    "  end\n" \
    "  if not top[1] or not best then redis.call('DEL', lock, holders, modes) return end\n" \
    "  local ms = tonumber(top[2]) - now_ms()\n" \
    "  if ms < 1 then ms = 1 end\n" \
    "  redis.call('SET', lock, best .. ':' .. str(bt), 'PX', str(ms))\n" \
    "end\n" \
    /* Drops the holders whose lease ended; returns how many hold. No lock \
     * key: nobody holds (the mirror outlives every holder's lease). */ \
    "local function prune()\n" \
    "  local v = redis.call('GET', lock)\n" \
    "  if not v then redis.call('DEL', holders, modes) return 0 end\n" \
    "  local dead = redis.call('ZRANGEBYSCORE', holders, '-inf', str(now_ms()))\n" \
    "  if #dead == 0 then return redis.call('ZCARD', holders) end\n" \
    "  local was = redis.call('HEXISTS', modes, string.sub(v, 1, 32)) == 1\n" \
    "  redis.call('ZREMRANGEBYSCORE', holders, '-inf', str(now_ms()))\n" \
    "  for i = 1, #dead, 1000 do\n" \
    "    redis.call('HDEL', modes, unpack(dead, i, math.min(i + 999, #dead)))\n" \
    "  end\n" \
    "  local n = redis.call('ZCARD', holders)\n" \
    "  if was and redis.call('HEXISTS', modes, string.sub(v, 1, 32)) == 0 then mirror()\n" \
    "  elseif n == 0 then redis.call('DEL', modes) end\n" \
    "  return n\n" \
    "end\n" \
    /* What the name is held as (after prune()): nil free, -1 by an \
     * exclusive holder, 0 by readers, N by permits of a semaphore of N. */ \
    "local function held_as(n)\n" \
    "  if n > 0 then return tonumber(redis.call('HGET', modes, 'limit') or '0') end\n" \
    "  if redis.call('EXISTS', lock) == 1 then return -1 end\n" \
    "  return nil\n" \
    "end\n" \
    /* Whether a request of kind k ('x' exclusive, 's' shared, 'p' a \
     * permit of limit lim) fits beside the n holders, the queue aside. */ \
    "local function fits(k, lim, n)\n" \
    "  local held = held_as(n)\n" \
    "  if held == nil then return true end\n" \
    "  if k == 's' then return held == 0 end\n" \
    "  if k == 'p' then return held == lim and n < lim end\n" \
    "  return false\n" \
    "end\n" \
    "local function hold(o, k, lim, ttl)\n" \
    "  local token, s = fast_token()\n" \
    "  redis.call('ZADD', holders, str(now_ms() + tonumber(ttl)), o)\n" \
    "  redis.call('HSET', modes, o, k .. ':' .. s, 'limit', str(lim))\n" \
    "  local p = redis.call('PTTL', lock)\n" \
    "  if p < tonumber(ttl) then p = tonumber(ttl) end\n" \
    "  redis.call('SET', lock, o .. ':' .. s, 'PX', str(p))\n" \
    "  return token\n" \
    "end\n" \
    /* Grants from the head of the queue what fits beside the n holders, \
     * in order, and stops at the first that does not (FIFO across kinds): \
     * an exclusive waiter alone, else every reader or permit up to the \
     * limit; one message to each waiter granted. A waiter's kind is its \
     * channel's tail: "#s" shared, "#p<N>" a permit, none exclusive (so \
     * an older release's handoff still reaches it, as an exclusive \
     * grant). Dead waiters (no subscriber) are skipped. Returns how many \
     * hold now. */ \
    "local function admit(n)\n" \
    "  while true do\n" \
    "    local e = redis.call('LINDEX', queue, 0)\n" \
    "    if not e then return n end\n" \
    "    local o, ttl, ch = string.match(e, '^(%x+)|(%d+)|(.+)$')\n" \
    "    if o and redis.call('PUBSUB', '" NUMSUB "', ch)[2] > 0 then\n" \
    "      local k, lim = string.match(ch, '#([sp])(%d*)$')\n" \
    "      k, lim = k or 'x', tonumber(lim) or 0\n" \
    "      if not fits(k, lim, n) then return n end\n" \
    "      redis.call('LPOP', queue)\n" \
    "      local token\n" \
    "      if k == 'x' then token = grant(o, ttl) else token = hold(o, k, lim, ttl); n = n + 1 end\n" \
    "      redis.call('" PUB "', ch, o .. ':' .. str(token))\n" \
    "      if k == 'x' then return n end\n" \
    "    else\n" \
    "      redis.call('LPOP', queue)\n" \
    "    end\n" \
    "  end\n" \
    "end\n" \
    "local function unlock()\n" \
    "  redis.call('DEL', lock)\n" \
    "  admit(0)\n" \
    "end\n" \
    "local function mine()\n" \
    "  local t = token_of(redis.call('HGET', modes, owner))\n" \
    "  if t and redis.call('ZSCORE', holders, owner) then return t end\n" \
    "  return nil\n" \
    "end\n" \
    /* A reader or permit holder leaves: 1, or 0 when not (or no longer) \
     * holding. An exclusive grant an older release's handoff made to a \
     * shared waiter is released as such. */ \
    "local function leave()\n" \
    "  local n = prune()\n" \
    "  if redis.call('ZSCORE', holders, owner) then\n" \
    "    local v = redis.call('GET', lock)\n" \
    "    redis.call('ZREM', holders, owner)\n" \
    "    redis.call('HDEL', modes, owner)\n" \
    "    n = n - 1\n" \
    "    if n <= 0 then redis.call('DEL', lock, holders, modes); n = 0\n" \
    "    elseif v and string.sub(v, 1, 32) == owner then mirror() end\n" \
    "    admit(n)\n" \
    "    return 1\n" \
    "  end\n" \
    "  if ours() then unlock() return 1 end\n" \
    "  return 0\n" \
    "end\n" \
    "if op == 'acquire' then\n" \
    "  local ttl, ch, mode = ARGV[3], ARGV[4], ARGV[5]\n" \
    /* Fast path, nobody queued and the lock free: a token is drawn only \
     * for a grant, so the counter is the last token granted (inspect). */ \
    "  if redis.call('EXISTS', queue, lock) == 0 then\n" \
    "    return {1, grant(owner, ttl)}\n" \
    "  end\n" \
    "  local t = ours()\n" \
    "  if t then return {1, t} end\n" \
    "  local n = prune()\n" \
    "  local held = held_as(n)\n" \
    "  if held and held > 0 then return {2, held} end\n" \
    "  if held == nil then\n" \
    "    admit(n)\n" \
    "    t = ours()\n" \
    "    if t then return {1, t} end\n" \
    "    if redis.call('EXISTS', queue, lock) == 0 then return {1, grant(owner, ttl)} end\n" \
    "  end\n" \
    "  if mode == 'wait' then\n" \
    "    local e = owner .. '|' .. ttl .. '|' .. ch\n" \
    "    if not redis.call('LPOS', queue, e) then redis.call('RPUSH', queue, e) end\n" \
    "  end\n" \
    "  return {0, redis.call('PTTL', lock)}\n" \
    "elseif op == 'release' then\n" \
    "  if not ours() then return 0 end\n" \
    "  unlock()\n" \
    "  return 1\n" \
    "elseif op == 'renew' then\n" \
    "  if not ours() then return 0 end\n" \
    "  redis.call('PEXPIRE', lock, ARGV[3])\n" \
    "  return 1\n" \
    /* A waiter that leaves may have held back those behind it that fit \
     * (readers behind a writer): they are served now. */ \
    "elseif op == 'cancel' then\n" \
    "  redis.call('LREM', queue, 0, ARGV[3])\n" \
    "  if not ours() then\n" \
    "    if redis.call('EXISTS', queue) == 1 then admit(prune()) end\n" \
    "    return 0\n" \
    "  end\n" \
    "  unlock()\n" \
    "  return 1\n" \
    "elseif op == 'grab' then\n" \
    "  local mine = ours()\n" \
    "  if mine then return {1, mine} end\n" \
    "  if redis.call('EXISTS', lock) == 0 then return {1, grant(owner, ARGV[3])} end\n" \
    "  return {0, redis.call('PTTL', lock)}\n" \
    "elseif op == 'fence' then\n" \
    "  local sc = redis.call('ZSCORE', holders, owner)\n" \
    "  if not ours() and not (sc and tonumber(sc) > now_ms()) then return 0 end\n" \
    "  local floor = tonumber(ARGV[3])\n" \
    /* Redlock's write-back (no mark) makes floor the holder's token (its \
     * grant's, which inspect_holders then tells on every node written): a \
     * reader's in the modes hash, a writer's in the lock key's value. */ \
    "  if sc and ARGV[4] ~= 'mark' then\n" \
    "    local k, t = string.match(redis.call('HGET', modes, owner) or '', '^(%a):(%d+)$')\n" \
    "    if t and tonumber(t) < floor then redis.call('HSET', modes, owner, k .. ':' .. ARGV[3]) end\n" \
    "  elseif ARGV[4] ~= 'mark' then\n" \
    "    local t, p = ours(), redis.call('PTTL', lock)\n" \
    "    if t and t < floor and p > 0 then redis.call('SET', lock, owner .. ':' .. ARGV[3], 'PX', p) end\n" \
    "  end\n" \
    "  local cur = tonumber(redis.call('GET', fence) or '0')\n" \
    "  if cur < floor then\n" \
    "    if ARGV[4] == 'mark' and KEYS[5] then\n" \
    "      local prev = cur\n" \
    "      local f, p = string.match(redis.call('GET', KEYS[5]) or '', '^(%d+):(%d+)$')\n" \
    "      if f and tonumber(f) == cur then prev = tonumber(p) end\n" \
    "      redis.call('SET', KEYS[5], ARGV[3] .. ':' .. str(prev))\n" \
    "    end\n" \
    "    redis.call('SET', fence, ARGV[3])\n" \
    "  end\n" \
    "  return 1\n" \
    /* Reads only: what inspect shows. A waiter counts when the handoff \
     * would serve it: its entry parses and its channel has a subscriber \
     * (a waiter that left or died has none). */ \
    "elseif op == 'inspect' then\n" \
    "  local listed = tonumber(ARGV[2]) or 0\n" \
    "  local live, first = 0, {}\n" \
    "  local n = redis.call('LLEN', queue)\n" \
    "  for i = 0, n - 1, 100 do\n" \
    "    local chans, owners = {}, {}\n" \
    "    for _, e in ipairs(redis.call('LRANGE', queue, i, i + 99)) do\n" \
    "      local o, ttl, ch = string.match(e, '^(%x+)|(%d+)|(.+)$')\n" \
    "      if o then chans[#chans + 1] = ch; owners[#owners + 1] = o end\n" \
    "    end\n" \
    "    if #chans > 0 then\n" \
    "      local subs = redis.call('PUBSUB', '" NUMSUB "', unpack(chans))\n" \
    "      for k = 1, #chans do\n" \
    "        if subs[2 * k] > 0 then\n" \
    "          live = live + 1\n" \
    "          if #first < listed then first[#first + 1] = owners[k] end\n" \
    "        end\n" \
    "      end\n" \
    "    end\n" \
    "  end\n" \
    "  local waiting = -1\n" \
    "  if ARGV[3] then waiting = redis.call('PUBSUB', '" NUMSUB "', ARGV[3])[2] end\n" \
    "  local raised = ''\n" \
    "  if KEYS[5] then raised = redis.call('GET', KEYS[5]) or '' end\n" \
    "  local v, pttl = redis.call('GET', lock) or '', redis.call('PTTL', lock)\n" \
    /* Shared holders or permits: the newest live one (not the mirror, \
     * which may name one whose lease ended and has the longest lease). */ \
    "  if v ~= '' and redis.call('EXISTS', holders) == 1 then\n" \
    "    local hs = redis.call('ZRANGEBYSCORE', holders, '(' .. str(now_ms()), '+inf', 'WITHSCORES')\n" \
    "    local bt, best, left = -1, nil, 0\n" \
    "    for i = 1, #hs, 2 do\n" \
    "      local t = token_of(redis.call('HGET', modes, hs[i]))\n" \
    "      if t and t > bt then bt, best, left = t, hs[i], tonumber(hs[i + 1]) - now_ms() end\n" \
    "    end\n" \
    "    if best then v, pttl = best .. ':' .. str(bt), left\n" \
    "    elseif redis.call('HEXISTS', modes, string.sub(v, 1, 32)) == 1 then v, pttl = '', -2 end\n" \
    "  end\n" \
    "  local pub = nil\n" \
    "  if KEYS[8] then pub = redis.call('GET', KEYS[8]) or '' end\n" \
    "  return {v, pttl, redis.call('GET', fence) or '', raised, live, first, waiting, pub}\n" \
    /* Elections (KEYS[8] the value key, also the channel): the holder \
     * stores "<owner><seq><value>" while the lock is its own, and wakes \
     * the observers; a wake alone after an election's release. */ \
    "elseif op == 'publish' then\n" \
    "  if not ours() then return 0 end\n" \
    "  redis.call('SET', KEYS[8], owner .. ARGV[3] .. ARGV[4])\n" \
    "  redis.call('" PUB "', KEYS[8], 'published')\n" \
    "  return 1\n" \
    "elseif op == 'wake' then\n" \
    "  redis.call('" PUB "', KEYS[8], 'woken')\n" \
    "  return 1\n" \
    "elseif op == 'drop' then\n" \
    "  if not ours() then return 0 end\n" \
    "  redis.call('DEL', lock)\n" \
    "  redis.call('" PUB "', ARGV[3], 'released')\n" \
    "  return 1\n" \
    /* Shared locks ("s") and permits ("p", limit N): ARGV owner ttl \
     * channel wait-mode kind limit. {1, token}, {0, ms to the next lease \
     * end}, or {2, the name's limit (0: a read-write lock)} when the name \
     * is held as another kind. */ \
    "elseif op == 'sacquire' then\n" \
    "  local ttl, ch, mode, k, lim = ARGV[3], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])\n" \
    "  local n = prune()\n" \
    "  local t = mine() or ours()\n" \
    "  if t then return {1, t} end\n" \
    "  if redis.call('EXISTS', queue) == 1 then\n" \
    "    n = admit(n)\n" \
    "    t = mine()\n" \
    "    if t then return {1, t} end\n" \
    "  end\n" \
    "  local held = held_as(n)\n" \
    "  if held == -1 then held = 0 end\n" \
    "  if held and held ~= lim then return {2, held} end\n" \
    "  if redis.call('EXISTS', queue) == 0 and fits(k, lim, n) then\n" \
    "    return {1, hold(owner, k, lim, ttl)}\n" \
    "  end\n" \
    "  if mode == 'wait' then\n" \
    "    local e = owner .. '|' .. ttl .. '|' .. ch\n" \
    "    if not redis.call('LPOS', queue, e) then redis.call('RPUSH', queue, e) end\n" \
    "  end\n" \
    "  if n > 0 then\n" \
    "    local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')\n" \
    "    return {0, tonumber(first[2]) - now_ms()}\n" \
    "  end\n" \
    "  return {0, redis.call('PTTL', lock)}\n" \
    "elseif op == 'srelease' then\n" \
    "  return leave()\n" \
    "elseif op == 'srenew' then\n" \
    "  prune()\n" \
    "  if redis.call('ZSCORE', holders, owner) then\n" \
    "    redis.call('ZADD', holders, 'XX', str(now_ms() + tonumber(ARGV[3])), owner)\n" \
    "    if redis.call('PTTL', lock) < tonumber(ARGV[3]) then\n" \
    "      redis.call('PEXPIRE', lock, ARGV[3])\n" \
    "    end\n" \
    "    return 1\n" \
    "  end\n" \
    "  if not ours() then return 0 end\n" \
    "  redis.call('PEXPIRE', lock, ARGV[3])\n" \
    "  return 1\n" \
    "elseif op == 'scancel' then\n" \
    "  redis.call('LREM', queue, 0, ARGV[3])\n" \
    "  if leave() == 1 then return 1 end\n" \
    "  if redis.call('EXISTS', queue) == 1 then admit(prune()) end\n" \
    "  return 0\n" \
    /* Redlock's shared grab and drop (no queue). */ \
    "elseif op == 'sgrab' then\n" \
    "  local n = prune()\n" \
    "  local t = mine() or ours()\n" \
    "  if t then return {1, t} end\n" \
    "  local held = held_as(n)\n" \
    "  if held == nil or held == 0 then return {1, hold(owner, 's', 0, ARGV[3])} end\n" \
    "  if held > 0 then return {2, held} end\n" \
    "  return {0, redis.call('PTTL', lock)}\n" \
    "elseif op == 'sdrop' then\n" \
    "  if leave() == 0 then return 0 end\n" \
    "  redis.call('" PUB "', ARGV[3], 'released')\n" \
    "  return 1\n" \
    /* Reads only: {how many hold, the name's limit, {the first ARGV[2] \
     * in grant order: {owner, kind, token, lease ms}}}; an exclusive \
     * holder is {lock value, 'x', '', PTTL}. */ \
    "elseif op == 'holders' then\n" \
    "  local cap = tonumber(ARGV[2]) or 0\n" \
    "  local v = redis.call('GET', lock)\n" \
    "  if not v then return {0, 0, {}} end\n" \
    "  local hs = redis.call('ZRANGEBYSCORE', holders, '(' .. str(now_ms()), '+inf', 'WITHSCORES')\n" \
    "  if #hs == 0 then\n" \
    "    if redis.call('HEXISTS', modes, string.sub(v, 1, 32)) == 1 then return {0, 0, {}} end\n" \
    "    local out = {}\n" \
    "    if cap > 0 then out[1] = {v, 'x', '', redis.call('PTTL', lock)} end\n" \
    "    return {1, 0, out}\n" \
    "  end\n" \
    "  local all, m, list = redis.call('HGETALL', modes), {}, {}\n" \
    "  for i = 1, #all, 2 do m[all[i]] = all[i + 1] end\n" \
    "  for i = 1, #hs, 2 do\n" \
    "    local k, t = string.match(m[hs[i]] or '', '^(%a):(%d+)$')\n" \
    "    list[#list + 1] = {hs[i], k or 's', tonumber(t or '0'), tonumber(hs[i + 1]) - now_ms()}\n" \
    "  end\n" \
    "  table.sort(list, function(a, b) return a[3] < b[3] end)\n" \
    "  local out = {}\n" \
    "  for i = 1, math.min(cap, #list) do\n" \
    "    out[i] = {list[i][1], list[i][2], str(list[i][3]), list[i][4]}\n" \
    "  end\n" \
    "  return {#list, tonumber(m['limit'] or '0'), out}\n" \
    "end\n" \
    "return redis.error_reply('dlock: unknown operation ' .. tostring(op))\n"

/* One Redis, Redlock, Sentinel: classic pub/sub. */
static const char dlock_redis_lua[] = DLOCK_REDIS_LUA("PUBLISH", "NUMSUB");
/* Redis Cluster: sharded pub/sub, so that a wake-up stays on the shard
 * that owns the lock's slot (the channel carries the lock's hash tag);
 * PUBLISH would be broadcast to every node of the cluster. */
static const char dlock_redis_lua_sharded[] = DLOCK_REDIS_LUA("SPUBLISH", "SHARDNUMSUB");

#endif
