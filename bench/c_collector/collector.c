/*
 * The seed article's collector (/work/shared/seeds/mailroom_accounts.txt), rebuilt from its
 * published snippets as the reference peer of `mailroom collect` in bench/bench_collector.py.
 * Not part of mailroom: it runs on the seed's own schema (bench/seed_accounts.sql, schema `seed`,
 * reached through search_path in the conninfo).
 *
 * What it does, as the article describes it:
 *   - connect, LISTEN on the channel (token_insert), prepare "SELECT 1" and the dequeue query
 *     (the token_data CTE joined with accounts, advancing jobs.last_seq in the same statement);
 *   - on connect, drain the backlog: dequeue batch_limit rows while full batches come back;
 *   - count notifications; when the count reaches the batch limit, or the batch timeout has passed
 *     since the first notification, dequeue that many tokens in chunks of the batch limit;
 *   - sign each token: HMAC-SHA256 over "/activate" || secret (or "/recover" || secret || code)
 *     with MAILROOM_SECRET_KEY (64 hex chars), URL-safe base64 (no padding) of secret || signature;
 *   - write one CSV line per dequeue: action,email,login,signed,code[,action,email,...]
 *     (action 1 = activation, 2 = password recovery);
 *   - wait in select() on the connection socket or the remaining timeout; health check when idle;
 *     reconnect when the connection breaks.
 * Departure from the original repository: its chunked dequeue sleeps 10 ms between chunks; the
 * article does not show it and this reference leaves it out (a faster peer, never a slower one).
 *
 * Environment: MAILROOM_DATABASE_URL (libpq conninfo), MAILROOM_SECRET_KEY, MAILROOM_BATCH_LIMIT
 * (default 10), MAILROOM_BATCH_TIMEOUT (ms, default 5000), MAILROOM_HEALTHCHECK_INTERVAL (ms,
 * default 270000), MAILROOM_CHANNEL_NAME (default token_insert), MAILROOM_QUEUE_NAME (default
 * mailroom). Logs go to stderr; "listening" is logged once the start-up drain is done.
 *
 * Build: cc -O2 -I"$(pg_config --includedir)" collector.c -o collector -lpq -lcrypto
 */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>

#include <libpq-fe.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#define STMT_DEQUEUE "dequeue"
#define STMT_HEALTHCHECK "healthcheck"
#define SECRET_LEN 32
#define CODE_LEN 5
#define SIG_LEN 32

static const char *DEQUEUE_SQL =
    "WITH token_data AS ("
    " SELECT t.account, t.secret, t.code, t.expires_at, t.id, t.action, a.email, a.login"
    " FROM jobs"
    " JOIN tokens t"
    "  ON t.id > jobs.last_seq"
    "  AND t.expires_at > EXTRACT(EPOCH FROM NOW())"
    "  AND t.consumed_at IS NULL"
    "  AND t.action IN ('activation', 'password_recovery')"
    " JOIN accounts a"
    "  ON a.id = t.account"
    "  AND ((t.action = 'activation' AND a.status = 'provisioned')"
    "   OR (t.action = 'password_recovery' AND a.status = 'active'))"
    " WHERE jobs.job_type = $1"
    " ORDER BY id ASC"
    " LIMIT $2"
    "), updated_jobs AS ("
    " UPDATE jobs SET last_seq = (SELECT MAX(id) FROM token_data)"
    " WHERE job_type = $1 AND EXISTS (SELECT 1 FROM token_data)"
    " RETURNING last_seq"
    ")"
    " SELECT td.action, td.email, td.login, td.secret, td.code FROM token_data td";

static volatile sig_atomic_t running = 1;
static unsigned char key[32];

static void on_signal(int sig)
{
  (void)sig;
  running = 0;
}

static void logf_(const char *fmt, ...)
{
  char stamp[32];
  time_t t = time(NULL);
  struct tm tm;
  va_list ap;
  localtime_r(&t, &tm);
  strftime(stamp, sizeof stamp, "%Y/%m/%d %H:%M:%S", &tm);
  fprintf(stderr, "%s [PG] ", stamp);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static long now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static int env_int(const char *name, int dflt)
{
  const char *v = getenv(name);
  char *end;
  long n;
  if (!v || !*v)
    return dflt;
  errno = 0;
  n = strtol(v, &end, 10);
  if (errno || *end || n <= 0 || n > 1000000000L)
  {
    logf_("invalid %s=%s; using %d", name, v, dflt);
    return dflt;
  }
  return (int)n;
}

static bool parse_key(const char *hex)
{
  if (!hex || strlen(hex) != 64)
    return false;
  for (int i = 0; i < 32; i++)
  {
    unsigned int byte;
    if (!isxdigit((unsigned char)hex[2 * i]) || !isxdigit((unsigned char)hex[2 * i + 1]) ||
        sscanf(hex + 2 * i, "%2x", &byte) != 1)
      return false;
    key[i] = (unsigned char)byte;
  }
  return true;
}

/* URL-safe base64 without padding; out must hold 4 * ceil(n / 3) + 1 bytes. */
static size_t b64url(char *out, const unsigned char *in, size_t n)
{
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  size_t o = 0, i = 0;
  for (; i + 2 < n; i += 3)
  {
    unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
    out[o++] = abc[v >> 18 & 63];
    out[o++] = abc[v >> 12 & 63];
    out[o++] = abc[v >> 6 & 63];
    out[o++] = abc[v & 63];
  }
  if (n - i == 1)
  {
    unsigned v = (unsigned)in[i] << 16;
    out[o++] = abc[v >> 18 & 63];
    out[o++] = abc[v >> 12 & 63];
  }
  else if (n - i == 2)
  {
    unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8;
    out[o++] = abc[v >> 18 & 63];
    out[o++] = abc[v >> 12 & 63];
    out[o++] = abc[v >> 6 & 63];
  }
  out[o] = '\0';
  return o;
}

/* "/activate" || secret, or "/recover" || secret || code; returns its length, 0 if unknown. */
static size_t signature_data(unsigned char *out, const char *action, const unsigned char *secret,
                             const char *code)
{
  if (strcmp(action, "activation") == 0)
  {
    memcpy(out, "/activate", 9);
    memcpy(out + 9, secret, SECRET_LEN);
    return 9 + SECRET_LEN;
  }
  if (strcmp(action, "password_recovery") == 0 && strlen(code) == CODE_LEN)
  {
    memcpy(out, "/recover", 8);
    memcpy(out + 8, secret, SECRET_LEN);
    memcpy(out + 8 + SECRET_LEN, code, CODE_LEN);
    return 8 + SECRET_LEN + CODE_LEN;
  }
  return 0;
}

/* One dequeue of at most `limit` tokens, written as one line. Rows, -1 (query failed: reconnect),
 * -2 (fatal). */
static int dequeue_once(PGconn *conn, const char *queue, int limit)
{
  char limitstr[16];
  const char *params[2] = {queue, limitstr};
  PGresult *res;
  int nrows, written = 0;
  int c_action, c_email, c_login, c_secret, c_code;

  snprintf(limitstr, sizeof limitstr, "%d", limit);
  res = PQexecPrepared(conn, STMT_DEQUEUE, 2, params, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK)
  {
    logf_("ERROR: dequeue failed: %s", PQerrorMessage(conn));
    PQclear(res);
    return -1;
  }
  nrows = PQntuples(res);
  if (nrows == 0)
  {
    PQclear(res);
    return 0;
  }
  c_action = PQfnumber(res, "action");
  c_email = PQfnumber(res, "email");
  c_login = PQfnumber(res, "login");
  c_secret = PQfnumber(res, "secret");
  c_code = PQfnumber(res, "code");
  if (c_action < 0 || c_email < 0 || c_login < 0 || c_secret < 0 || c_code < 0)
  {
    logf_("FATAL: missing columns in the result set");
    PQclear(res);
    return -2;
  }

  for (int i = 0; i < nrows; i++)
  {
    const char *action = PQgetvalue(res, i, c_action);
    const char *code = PQgetvalue(res, i, c_code);
    size_t secret_len = 0, data_len;
    unsigned char *secret = PQunescapeBytea((const unsigned char *)PQgetvalue(res, i, c_secret), &secret_len);
    unsigned char data[8 + SECRET_LEN + CODE_LEN + 8];
    unsigned char signed_[SECRET_LEN + SIG_LEN];
    unsigned int sig_len = SIG_LEN;
    char encoded[4 * ((SECRET_LEN + SIG_LEN + 2) / 3) + 1];

    if (!secret || secret_len != SECRET_LEN)
    {
      logf_("WARN: skipping row; bad secret");
      if (secret)
        PQfreemem(secret);
      continue;
    }
    data_len = signature_data(data, action, secret, code);
    memcpy(signed_, secret, SECRET_LEN);
    PQfreemem(secret);
    if (data_len == 0 ||
        !HMAC(EVP_sha256(), key, sizeof key, data, data_len, signed_ + SECRET_LEN, &sig_len) ||
        sig_len != SIG_LEN)
    {
      logf_("WARN: skipping row; signing failed");
      continue;
    }
    b64url(encoded, signed_, sizeof signed_);
    printf("%s%d,%s,%s,%s,%s", written ? "," : "", action[0] == 'a' ? 1 : 2,
           PQgetvalue(res, i, c_email), PQgetvalue(res, i, c_login), encoded, code);
    written++;
  }
  if (written)
  {
    putchar('\n');
    fflush(stdout);
  }
  PQclear(res);
  return nrows;
}

/* `remaining` tokens in chunks of at most `chunk`; total rows or a negative error. */
static int dequeue(PGconn *conn, const char *queue, int remaining, int chunk)
{
  int total = 0;
  while (remaining > 0)
  {
    int n = dequeue_once(conn, queue, remaining > chunk ? chunk : remaining);
    if (n < 0)
      return n;
    total += n;
    remaining -= chunk;
  }
  return total;
}

static bool exec_ok(PGconn *conn, PGresult *res)
{
  bool ok = res && (PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK);
  (void)conn;
  PQclear(res);
  return ok;
}

static bool db_connect(PGconn **conn, const char *conninfo, const char *channel)
{
  char *ident;
  char sql[160];
  *conn = PQconnectdb(conninfo);
  if (PQstatus(*conn) != CONNECTION_OK)
    return false;
  ident = PQescapeIdentifier(*conn, channel, strlen(channel));
  if (!ident)
    return false;
  snprintf(sql, sizeof sql, "LISTEN %s", ident);
  PQfreemem(ident);
  return exec_ok(*conn, PQexec(*conn, sql)) &&
         exec_ok(*conn, PQprepare(*conn, STMT_HEALTHCHECK, "SELECT 1", 0, NULL)) &&
         exec_ok(*conn, PQprepare(*conn, STMT_DEQUEUE, DEQUEUE_SQL, 2, NULL));
}

static bool healthcheck(PGconn *conn)
{
  return PQstatus(conn) == CONNECTION_OK &&
         exec_ok(conn, PQexecPrepared(conn, STMT_HEALTHCHECK, 0, NULL, NULL, NULL, 0));
}

int main(void)
{
  const char *conninfo = getenv("MAILROOM_DATABASE_URL");
  const char *channel = getenv("MAILROOM_CHANNEL_NAME");
  const char *queue = getenv("MAILROOM_QUEUE_NAME");
  int batch_limit = env_int("MAILROOM_BATCH_LIMIT", 10);
  int timeout_ms = env_int("MAILROOM_BATCH_TIMEOUT", 5000);
  int healthcheck_ms = env_int("MAILROOM_HEALTHCHECK_INTERVAL", 270000);
  PGconn *conn = NULL;
  PGnotify *notify;
  fd_set active_fds, read_fds;
  struct timeval tv;
  int sock = -1, seen = 0, ready = -1, result = 0, rc;
  long start = now_ms(), last_healthcheck = start, now, remaining_ms;

  if (!channel || !*channel)
    channel = "token_insert";
  if (!queue || !*queue)
    queue = "mailroom";
  if (!conninfo)
  {
    logf_("ERROR: MAILROOM_DATABASE_URL not set");
    return EXIT_FAILURE;
  }
  if (!parse_key(getenv("MAILROOM_SECRET_KEY")))
  {
    logf_("ERROR: MAILROOM_SECRET_KEY must be 64 hex characters");
    return EXIT_FAILURE;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  signal(SIGPIPE, SIG_IGN);
  logf_("configured; channel=%s queue=%s limit=%d timeout=%dms healthcheck-interval=%dms", channel, queue,
        batch_limit, timeout_ms, healthcheck_ms);

  while (running)
  {
    if (ready < 0)
    {
      if (conn)
        PQfinish(conn);
      if (!db_connect(&conn, conninfo, channel))
      {
        logf_("ERROR: connection failed: %s", conn ? PQerrorMessage(conn) : "out of memory");
        if (conn)
          PQfinish(conn);
        return EXIT_FAILURE;
      }
      logf_("connected");
      /* notifications sent while away are lost: drain what is pending */
      while (running && (result = dequeue(conn, queue, batch_limit, batch_limit)) == batch_limit)
        ;
      if (result < 0)
      {
        PQfinish(conn);
        return EXIT_FAILURE;
      }
      logf_("listening");
      FD_ZERO(&active_fds);
      sock = PQsocket(conn);
      FD_SET(sock, &active_fds);
      seen = 0;
      ready = 0;
      last_healthcheck = now_ms();
      continue;
    }
    if (ready > 0)
    {
      result = dequeue(conn, queue, seen, batch_limit);
      if (result == -2)
        break;
      if (result == -1)
      {
        logf_("WARN: forcing reconnect...");
        ready = -1;
        continue;
      }
      if (result != seen)
        logf_("WARN: expected %d items to be processed, got %d", seen, result);
      seen = 0;
      ready = 0;
      last_healthcheck = now_ms();
    }

    while (running && (notify = PQnotifies(conn)) != NULL)
    {
      PQfreemem(notify);
      if (seen == 0)
        start = now_ms(); /* first notification of a batch: its timer starts */
      seen++;
      PQconsumeInput(conn);
    }
    if (seen >= batch_limit)
    {
      ready = 1;
      continue;
    }

    now = now_ms();
    remaining_ms = timeout_ms - (now - start);
    if (remaining_ms < 0)
      remaining_ms = 0;
    tv.tv_sec = remaining_ms / 1000;
    tv.tv_usec = (remaining_ms % 1000) * 1000;
    read_fds = active_fds;
    rc = select(sock + 1, &read_fds, NULL, NULL, &tv);
    if (rc < 0)
    {
      if (errno == EINTR)
        continue;
      logf_("ERROR: select failed: %s", strerror(errno));
      break;
    }
    if (rc == 0)
    {
      start = now_ms();
      if (seen > 0)
      {
        ready = 1;
        continue;
      }
      if ((sock = PQsocket(conn)) < 0)
      {
        ready = -1;
        continue;
      }
      if (now - last_healthcheck >= healthcheck_ms)
      {
        if (!healthcheck(conn))
        {
          ready = -1;
          continue;
        }
        last_healthcheck = start;
      }
    }
    if (!FD_ISSET(sock, &read_fds))
      continue;
    do
    {
      if (!PQconsumeInput(conn))
      {
        logf_("WARN: error consuming input: %s", PQerrorMessage(conn));
        if (PQstatus(conn) != CONNECTION_OK)
        {
          ready = -1;
          break;
        }
      }
    } while (running && PQisBusy(conn));
  }
  if (conn)
    PQfinish(conn);
  logf_("stopped");
  return running ? EXIT_FAILURE : EXIT_SUCCESS;
}
