"""Claims: leases in each model's ``holders`` sorted set, taken, renewed and given up by one script each. Every
script starts with a write that takes no memory (``swapless.tasks.broker.connection.WRITE_FIRST_NOTE``).
"""

from __future__ import annotations

__all__ = ["CLAIM", "RELEASE", "RENEW"]

#: KEYS: holders. ARGV: worker, now (ms), lease (ms), most holders, then workers known dead (their claims go first).
#: 1: the worker holds a claim now, 0: refused.
CLAIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
for i = 5, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
local expiry = tonumber(ARGV[2]) + tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], expiry, ARGV[1])
  return 1
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], expiry, ARGV[1])
return 1
"""

#: KEYS: holders. ARGV: worker, now (ms), lease (ms). 1: renewed, 0: the claim had lapsed (someone may hold it now).
RENEW = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + tonumber(ARGV[3]), ARGV[1])
  return 1
end
return 0
"""

#: KEYS: holders. ARGV: worker, now (ms), 1 to keep the last holder's claim. 1: released.
RELEASE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if ARGV[3] == '1' and redis.call('ZCARD', KEYS[1]) <= 1 then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
"""
