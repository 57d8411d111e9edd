"""The Lua scripts that store, count, read and cancel job results (``swapless.tasks.broker.results.ResultStore``).

Each starts with a write that takes no memory (``swapless.tasks.broker.connection.WRITE_FIRST_NOTE``).
"""

__all__ = ["CANCEL", "PRIOR", "SET_FIRST_WINS", "START", "STORE_MANY"]

# KEYS: the result, the job's attempt counter, the gateway's record of the job. The counter ends with the result
# (deleted first), the result is stored only if absent, and published so that Celery's
# AsyncResult.get() wakes up. A job the gateway accepted has a record: it is marked done (its owner's in-flight
# count drops) and outlives the result by one result expiry, so that a read after that says "expired".
SET_FIRST_WINS = """
redis.call('DEL', KEYS[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'done', 1)
  redis.call('EXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
end
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
if ok then
  redis.call('PUBLISH', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


# What ``prior`` reads and counts for a group of single jobs, in one call. KEYS: the jobs' results, then their attempt
# counters, in the same order. ARGV: the expiry, then k: the first k jobs are about to run. Per job: -1 it has a
# result; else the attempts started before (0: none), and a job among the first k with none gets its first counted.
# The first write (EXPIRE) takes no memory (``WRITE_FIRST_NOTE``).
PRIOR = """
local n = #KEYS / 2
redis.call('EXPIRE', KEYS[n + 1], ARGV[1])
local k = tonumber(ARGV[2])
local found = {}
for first = 1, n, 500 do
  local last = math.min(first + 499, n)
  local results = redis.call('MGET', unpack(KEYS, first, last))
  local counts = redis.call('MGET', unpack(KEYS, n + first, n + last))
  for j = 1, last - first + 1 do
    local i = first + j - 1
    if results[j] then
      found[i] = -1
    else
      local count = tonumber(counts[j] or '0')
      if count == 0 and i <= k then
        redis.call('SETEX', KEYS[n + i], ARGV[1], 1)  -- absent: read above, in this script
      end
      found[i] = count
    end
  end
end
return found
"""

# The same for many jobs in one call. KEYS: per job its result, attempt counter and record. ARGV: the expiry, then
# each job's value. Returns per job 1 (stored) or 0 (a result was there). One call per group instead of one per job
# (a pipeline of one script call per job costs the worker more to write and to read than the stores cost Redis).
STORE_MANY = """
local expires = tonumber(ARGV[1])
local stored = {}
for i = 1, #KEYS / 3 do
  local result = KEYS[3 * i - 2]
  redis.call('DEL', KEYS[3 * i - 1])
  if redis.call('EXISTS', KEYS[3 * i]) == 1 then
    redis.call('HSET', KEYS[3 * i], 'done', 1)
    redis.call('EXPIRE', KEYS[3 * i], 2 * expires)
  end
  if redis.call('SET', result, ARGV[i + 1], 'NX', 'EX', expires) then
    redis.call('PUBLISH', result, ARGV[i + 1])
    stored[i] = 1
  else
    stored[i] = 0
  end
end
return stored
"""


# KEYS: n attempt counters, then the n matching result keys (a chunk item's: its chunk's). ARGV: the expiry, then
# the mode: "fresh" counts a first attempt (1) only on counters with no count yet (the reads before a group),
# "count" adds one to every counter (a batch about to run). A job that has a result already (cancelled, or done by
# another worker since it was read) is not counted: returns 1 per such job, else 0. The first EXPIRE writes nothing
# new (``WRITE_FIRST_NOTE``).
START = """
redis.call('EXPIRE', KEYS[1], ARGV[1])
local n = #KEYS / 2
local done = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[n + i]) == 1 then
    done[i] = 1
  else
    if ARGV[2] == 'fresh' then
      redis.call('SET', KEYS[i], 1, 'NX', 'EX', ARGV[1])
    else
      redis.call('INCR', KEYS[i])
      redis.call('EXPIRE', KEYS[i], ARGV[1])
    end
    done[i] = 0
  end
end
return done
"""


# KEYS: a job's result, its attempt counter, the gateway's record of it. A job with a result keeps it (2: done); a
# job started at least once runs to its end (1: too late); else the cancellation is its result, published like any
# other (0: cancelled), and its record (if any) is done. EXISTS first: a full Redis still answers a cancel that
# writes nothing.
CANCEL = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 2
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
redis.call('PUBLISH', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'done', 1)
end
return 0
"""
