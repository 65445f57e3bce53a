/* The gate in front of the routes that change the server's state (the
 * repository's load and unload).
 *
 * What it stops: the routes are reachable by anything that can open a
 * connection to the address, and on the default 127.0.0.1 that includes
 * every web page open in a browser on the same machine. A page may send a
 * "simple" cross-origin POST (text/plain, form or no Content-Type, no custom
 * header) without asking first; it cannot read the answer, but the model is
 * unloaded all the same. Hence three independent checks, each enough alone
 * against a page:
 *   - a bearer token (the page does not know it; a page cannot add an
 *     Authorization header to a simple request either), compared in
 *     constant time so its bytes cannot be found one by one from timings;
 *   - the Origin a browser puts on every cross-origin POST must name the
 *     server's own Host (a DNS-rebinding page passes this one, not the
 *     token);
 *   - a body, if any, must be application/json, a type a page cannot send
 *     without a CORS preflight (which the server never grants).
 * The routes are off altogether unless the operator turns them on.
 *
 * Pure functions over the header values: no state, no allocation, callable
 * from any thread. */
#include "common/internal.h"
#include "server/server_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define TOKEN_MIN 16

int es__srv_token_valid(const char *token) {
  size_t n = token ? strnlen(token, ES_SERVER_TOKEN_MAX) : 0;
  if (n < TOKEN_MIN || n >= ES_SERVER_TOKEN_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (token[i] < 0x21 || token[i] > 0x7e)
      return 0;
  return 1;
}

/* Equal strings, in a time that depends on want's length only. */
static int same_secret(const char *want, const char *got, size_t got_len) {
  size_t n = strlen(want);
  volatile unsigned char diff = (unsigned char)(n != got_len);
  for (size_t i = 0; i < n; i++)
    diff |= (unsigned char)want[i] ^ (unsigned char)(i < got_len ? got[i] : 0);
  return diff == 0;
}

static int is_space(char c) { return c == ' ' || c == '\t'; }

/* The credentials of "Bearer <token>" (scheme in any case), trailing blanks
 * dropped; NULL for another scheme or none. */
static const char *bearer(const char *auth, size_t *len) {
  if (!auth)
    return NULL;
  while (is_space(*auth))
    auth++;
  if (strncasecmp(auth, "Bearer", 6) || !is_space(auth[6]))
    return NULL;
  const char *t = auth + 6;
  while (is_space(*t))
    t++;
  size_t n = strlen(t);
  while (n && is_space(t[n - 1]))
    n--;
  *len = n;
  return n ? t : NULL;
}

/* "host[:port]" or "[v6]:port" split; port 0 when absent. 0, or -1 when
 * malformed. */
static int split_authority(const char *a, size_t len, const char **host, size_t *hlen,
                           unsigned *port) {
  const char *colon = NULL;
  if (len && a[0] == '[') {
    const char *close = memchr(a, ']', len);
    if (!close)
      return -1;
    *host = a;
    *hlen = (size_t)(close - a) + 1;
    if (*hlen < len) {
      if (a[*hlen] != ':')
        return -1;
      colon = a + *hlen;
    }
  } else {
    colon = memchr(a, ':', len);
    *host = a;
    *hlen = colon ? (size_t)(colon - a) : len;
  }
  *port = 0;
  if (colon) {
    const char *p = colon + 1, *end = a + len;
    if (p == end || end - p > 5)
      return -1;
    unsigned v = 0;
    for (; p < end; p++) {
      if (!isdigit((unsigned char)*p))
        return -1;
      v = v * 10 + (unsigned)(*p - '0');
    }
    if (v == 0 || v > 65535)
      return -1;
    *port = v;
  }
  return *hlen ? 0 : -1;
}

int es__srv_guard_origin(const char *origin, const char *host, char *why, size_t whylen) {
  if (!origin)
    return 0; /* not a browser's cross-origin request */
  const char *o = origin;
  unsigned dflt = 0;
  if (!strncasecmp(o, "http://", 7)) {
    o += 7;
    dflt = 80;
  } else if (!strncasecmp(o, "https://", 8)) {
    o += 8;
    dflt = 443;
  }
  const char *oh, *hh;
  size_t ohl, hhl;
  unsigned op, hp;
  if (!dflt || split_authority(o, strlen(o), &oh, &ohl, &op) < 0) {
    snprintf(why, whylen, "Origin '%.80s' is not this server's: state-changing requests are "
             "not taken from web pages of other sites", origin);
    return 403;
  }
  if (!host || split_authority(host, strlen(host), &hh, &hhl, &hp) < 0) {
    snprintf(why, whylen, "a request with an Origin needs a valid Host header");
    return 403;
  }
  if (!op)
    op = dflt;
  /* A Host without a port is what a TLS proxy in front passes on: the
   * client's port is then its scheme's default. */
  int same = ohl == hhl && !strncasecmp(oh, hh, ohl) && (hp ? op == hp : op == dflt);
  if (!same) {
    snprintf(why, whylen, "Origin '%.80s' is not this server's (Host '%.80s'): state-changing "
             "requests are not taken from web pages of other sites", origin, host);
    return 403;
  }
  return 0;
}

int es__srv_guard_control(const es_server_config *cfg, const char *authorization,
                          const char *origin, const char *host, const char *content_type,
                          size_t body_len, char *why, size_t whylen) {
  if (!cfg->repository_control) {
    snprintf(why, whylen, "repository control is disabled: start the server with "
             "--repository-control and a control token (\"repository_control\": true and "
             "\"control_token\" in the config) to load and unload models over HTTP");
    return 403;
  }
  size_t len = 0;
  const char *tok = bearer(authorization, &len);
  if (!tok || !es__srv_token_valid(cfg->control_token) ||
      !same_secret(cfg->control_token, tok, len)) {
    snprintf(why, whylen, "%s", tok ? "the bearer token is not the control token"
                                    : "repository control needs \"Authorization: Bearer "
                                      "<control token>\"");
    return 401;
  }
  int rc = es__srv_guard_origin(origin, host, why, whylen);
  if (rc)
    return rc;
  if (body_len) {
    size_t n = 0;
    const char *ct = content_type ? content_type : "";
    while (is_space(*ct))
      ct++;
    while (ct[n] && ct[n] != ';' && !is_space(ct[n]))
      n++;
    if (n != 16 || strncasecmp(ct, "application/json", 16)) {
      snprintf(why, whylen, "a repository request's body must be application/json, got %s%.80s%s",
               content_type ? "'" : "", content_type ? content_type : "no Content-Type",
               content_type ? "'" : "");
      return 415;
    }
  }
  return 0;
}
