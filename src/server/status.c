/* One mapping from a library return code to what the HTTP answer carries.
 *
 * Every route that turns an ES_E* code into a response goes through
 * es__srv_status_of, so a code means the same status, Retry-After and counter
 * wherever it comes from (a model, a pipeline, the repository API). The rule
 * for each code:
 *
 *   0                        200
 *   ES_EAGAIN                refused by admission or removed from the queue:
 *                            429 for QUEUE_FULL and OVER_CONCURRENCY (the
 *                            client sends too much), 503 for the others
 *                            (the server is short of memory or draining)
 *   ES_ETIMEDOUT             503: a deadline passed before the run (or a
 *                            drain did not finish in time)
 *   ES_ECANCELED             503: cancelled because the server is draining
 *   ES_ENOSPC                503: larger than the whole memory budget, or
 *                            than the largest arena the runtime can give
 *   ES_ENOMEM                503: no memory for the request right now,
 *                            counted as a memory refusal (OVER_MEMORY), as
 *                            the runtime's own shortages are (ES_EAGAIN)
 *   ES_ENOENT                404: the model (or its file) is not there
 *   ES_ESTATE                409: the model's state does not allow it now
 *                            (unloading a model a loaded pipeline runs on)
 *   ES_EINVAL, ES_EMODEL,    400: the request (or the model it names) cannot
 *   ES_ENOTSUP, ES_EOVERFLOW,     be run as given (ES_EBOUND: its data made a
 *   ES_EBOUND                     shape larger than the plan's bound)
 *   anything else            500
 *
 * Retry-After, on every 429 and 503: the admission's measured estimate of
 * when the refused work would fit (es_refusal.retry_after_ms) whenever one
 * was made; without one, 60 s for ES_ENOSPC (only a change of budget or load
 * helps, the admission's longest hint) and 1 s for the rest. */
#include "common/internal.h"
#include "server/server_internal.h"

#define RETRY_NO_ESTIMATE_MS 1000u
#define RETRY_NEVER_FITS_MS 60000u

uint32_t es__srv_retry_after_ms(unsigned http, int rc, uint32_t estimate_ms) {
  if (http != 429 && http != 503)
    return 0;
  if (estimate_ms)
    return estimate_ms;
  return rc == ES_ENOSPC ? RETRY_NEVER_FITS_MS : RETRY_NO_ESTIMATE_MS;
}

srv_status es__srv_status_of(int rc, const es_refusal *why) {
  srv_status st = {500, 0, SRV_OUT_ERROR, ES_REFUSE_NONE};
  int reason = why ? why->reason : ES_REFUSE_NONE;
  switch (rc) {
  case 0:
    st = (srv_status){200, 0, SRV_OUT_SUCCESS, ES_REFUSE_NONE};
    break;
  case ES_EAGAIN:
    st.http = reason == ES_REFUSE_QUEUE_FULL || reason == ES_REFUSE_OVER_CONCURRENCY ? 429 : 503;
    st.outcome = SRV_OUT_REFUSED;
    st.reason = reason;
    break;
  case ES_ETIMEDOUT:
    st = (srv_status){503, 0, SRV_OUT_REFUSED, ES_REFUSE_DEADLINE};
    break;
  case ES_ECANCELED:
    st = (srv_status){503, 0, SRV_OUT_REFUSED, ES_REFUSE_DRAINING};
    break;
  case ES_ENOSPC:
    st = (srv_status){503, 0, SRV_OUT_REFUSED, ES_REFUSE_OVER_MEMORY};
    break;
  case ES_ENOMEM:
    st = (srv_status){503, 0, SRV_OUT_REFUSED, ES_REFUSE_OVER_MEMORY};
    break;
  case ES_ENOENT:
    st = (srv_status){404, 0, SRV_OUT_NONE, ES_REFUSE_NONE};
    break;
  case ES_ESTATE:
    st = (srv_status){409, 0, SRV_OUT_NONE, ES_REFUSE_NONE};
    break;
  case ES_EINVAL:
  case ES_EMODEL:
  case ES_ENOTSUP:
  case ES_EOVERFLOW:
  case ES_EBOUND:
    st = (srv_status){400, 0, SRV_OUT_BAD_REQUEST, ES_REFUSE_NONE};
    break;
  default:
    break;
  }
  st.retry_after_ms = es__srv_retry_after_ms(st.http, rc, why ? why->retry_after_ms : 0);
  return st;
}
