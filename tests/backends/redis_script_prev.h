/*
 * The lock script of the previous release (backends/redis_script.h at
 * commit 6d7fa32, before shared locks and semaphores), kept as it was so
 * that tests/backends/test_redis_modes.c can check that its exclusive
 * locks and today's shared holders and permits still exclude each other.
 * Its own text below is unchanged.
 *
 * The one Lua script behind every Redis lock operation, loaded once per
 * connection (SCRIPT LOAD) and called by SHA (EVALSHA, EVAL on NOSCRIPT).
 *
 * Keys:   KEYS[1] lock   (string "<owner>:<token>", PX lease)
 *         KEYS[2] fence  (integer counter, never expires)
 *         KEYS[3] queue  (list of waiting entries "<owner>|<ttl>|<channel>")
 *         KEYS[4] floor  (integer, "<prefix>floor": the store-wide floor of
 *                         raise_floor, never expires; missing means 0)
 * ARGV[1] is the operation:
 *   acquire owner ttl channel mode  → {1, token} granted, or {0, pttl}
 *                                     (mode "wait" queues the caller once)
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
 *   inspect listed [channel]        → reads only (with KEYS[5]):
 *                                     {lock value or "", PTTL lock, counter
 *                                     or "", raised mark or "", live waiters,
 *                                     {their first `listed` owners, in queue
 *                                     order}, PUBSUB NUMSUB channel or -1}
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
#ifndef DLOCK_TESTS_BACKENDS_REDIS_SCRIPT_PREV_H
#define DLOCK_TESTS_BACKENDS_REDIS_SCRIPT_PREV_H

/* The hot paths come first, in straight-line code: an uncontended
 * acquire (lock free, nobody queued), a release or renew by the owner with
 * nobody queued. The rest of the script creates a closure per helper on
 * every call, which costs the server about as much as the commands
 * themselves; these paths create none and call Redis the fewest times
 * (acquire: EXISTS, TIME, MGET, SET fence, SET lock). Everything else,
 * and a fast path that finds the queue non-empty, falls through to the
 * general code below, whose grants draw their tokens with the same
 * fast_token(). */
#define DLOCK_REDIS_LUA_PREV(PUB, NUMSUB) \
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
    "  return token, s\n" \
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
    /* Hands a free lock to the first live waiter; returns its owner or nil. */ \
    "local function handoff()\n" \
    "  while true do\n" \
    "    local e = redis.call('LPOP', queue)\n" \
    "    if not e then return nil end\n" \
    "    local o, ttl, ch = string.match(e, '^(%x+)|(%d+)|(.+)$')\n" \
    "    if o and redis.call('PUBSUB', '" NUMSUB "', ch)[2] > 0 then\n" \
    "      local token = grant(o, ttl)\n" \
    "      redis.call('" PUB "', ch, o .. ':' .. str(token))\n" \
    "      return o\n" \
    "    end\n" \
    "  end\n" \
    "end\n" \
    "local function unlock()\n" \
    "  redis.call('DEL', lock)\n" \
    "  handoff()\n" \
    "end\n" \
    "if op == 'acquire' then\n" \
    "  local ttl, ch, mode = ARGV[3], ARGV[4], ARGV[5]\n" \
    /* Fast path, nobody queued and the lock free: a token is drawn only \
     * for a grant, so the counter is the last token granted (inspect). */ \
    "  if redis.call('EXISTS', queue, lock) == 0 then\n" \
    "    return {1, grant(owner, ttl)}\n" \
    "  end\n" \
    "  local mine = ours()\n" \
    "  if mine then return {1, mine} end\n" \
    "  if redis.call('EXISTS', lock) == 0 then\n" \
    "    local o = handoff()\n" \
    "    if o == nil then return {1, grant(owner, ttl)} end\n" \
    "    if o == owner then return {1, ours()} end\n" \
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
    "elseif op == 'cancel' then\n" \
    "  redis.call('LREM', queue, 0, ARGV[3])\n" \
    "  if not ours() then return 0 end\n" \
    "  unlock()\n" \
    "  return 1\n" \
    "elseif op == 'grab' then\n" \
    "  local mine = ours()\n" \
    "  if mine then return {1, mine} end\n" \
    "  if redis.call('EXISTS', lock) == 0 then return {1, grant(owner, ARGV[3])} end\n" \
    "  return {0, redis.call('PTTL', lock)}\n" \
    "elseif op == 'fence' then\n" \
    "  if not ours() then return 0 end\n" \
    "  local floor = tonumber(ARGV[3])\n" \
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
    "  return {redis.call('GET', lock) or '', redis.call('PTTL', lock),\n" \
    "          redis.call('GET', fence) or '', raised, live, first, waiting}\n" \
    "elseif op == 'drop' then\n" \
    "  if not ours() then return 0 end\n" \
    "  redis.call('DEL', lock)\n" \
    "  redis.call('" PUB "', ARGV[3], 'released')\n" \
    "  return 1\n" \
    "end\n" \
    "return redis.error_reply('dlock: unknown operation ' .. tostring(op))\n"

/* One Redis: classic pub/sub. */
static const char dlock_redis_lua_prev[] = DLOCK_REDIS_LUA_PREV("PUBLISH", "NUMSUB");

#endif
