/* Giving up a privilege for a test that must see the unprivileged path.
 *
 * Root holds CAP_IPC_LOCK, which lets it lock memory past RLIMIT_MEMLOCK, so
 * the limit's error is only seen once the capability is gone. Dropped from
 * the effective and permitted sets, it cannot come back: call it in a forked
 * child, which exits 0 (passed), ES_TEST_CHILD_SKIP (the privilege stayed)
 * or anything else (failed); es_test_child_wait reads that verdict.
 * Header-only. */
#ifndef ES_TEST_PRIVILEGES_H
#define ES_TEST_PRIVILEGES_H

#include "es_test.h"

#include <linux/capability.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define ES_TEST_CHILD_SKIP 77

static inline void es_test_ipc_lock_drop(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capget, &hdr, data) != 0)
    return;
  data[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
  data[CAP_TO_INDEX(CAP_IPC_LOCK)].permitted &= ~CAP_TO_MASK(CAP_IPC_LOCK);
  syscall(SYS_capset, &hdr, data);
}

/* Waits for the forked child pid, then unlinks path (when not NULL: a file
 * the child used); the test passes, is skipped or fails as the child said. */
static inline void es_test_child_wait(pid_t pid, const char *path) {
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (path)
    unlink(path);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == ES_TEST_CHILD_SKIP)
    skip();
  assert_int_equal(WEXITSTATUS(status), 0);
}

#endif
