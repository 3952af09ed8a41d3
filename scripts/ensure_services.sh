#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis the tests use are up; start them when they are not.
# A service that cannot be started is a failure with a plain message, never a silent skip.
set -u
PGHOST=${PGHOST:-127.0.0.1}
PGPORT=${PGPORT:-5432}
REDIS_PORT=${REDIS_PORT:-6379}

pg_up() { pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "PostgreSQL is not running on $PGHOST:$PGPORT: starting it"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  fi
  if ! pg_up; then
    echo "MISSING: PostgreSQL at $PGHOST:$PGPORT (trust auth, database 'test'). Install and start it" >&2
    echo "  (Debian: apt-get install postgresql && pg_ctlcluster --skip-systemctl-redirect 15 main start)," >&2
    echo "  or point DATABASE_URL at one." >&2
    exit 1
  fi
fi

if ! redis_up; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "Redis is not running on 127.0.0.1:$REDIS_PORT: starting it"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
    for _ in $(seq 1 30); do redis_up && break; sleep 1; done
  fi
  if ! redis_up; then
    echo "MISSING: Redis at 127.0.0.1:$REDIS_PORT. Install and start it (Debian: apt-get install redis-server)," >&2
    echo "  or point REDIS_URL at one." >&2
    exit 1
  fi
fi
echo "services: PostgreSQL $PGHOST:$PGPORT and Redis 127.0.0.1:$REDIS_PORT are up"
