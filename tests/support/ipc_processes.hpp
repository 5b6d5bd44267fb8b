// Tests that share pool memory between processes (design.md §14) run the other process as
// their own binary again: a DISABLED_ IpcChild test, chosen by --gtest_filter, joined to the
// test by a socketpair for arcpool's connection and another for the test's own reports.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "arcpool/arcpool.h"

namespace arcpool::test {

/// The other process, seen from the test's.
struct child {
  pid_t pid = -1;
  int socket = -1;  ///< the parent's end of arcpool's connection
  int pipe = -1;    ///< the parent's end of the control socket
};

/// Runs this binary's IpcChild.DISABLED_<role> with the child's ends of both sockets in
/// ARCPOOL_IPC_SOCKET and ARCPOOL_IPC_PIPE; `extra_env`: more NAME=VALUE settings for it.
child spawn_child(const char* role, std::vector<std::string> extra_env = {});

/// Reads the other side's next report from the control socket ('\0' at end of file or after
/// 60 s).
char read_report(int fd);

/// Waits for the child; its wait status.
int reap(pid_t pid);

/// Polls `done` every millisecond for up to 20 s.
template <class F>
bool eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// The exporter's allocations sent and not yet released.
size_t outstanding(arcpool_ipc_exporter_t* e);

// --- In the child -------------------------------------------------------------------------

/// The descriptor the environment variable `name` holds (-1 when unset).
int env_fd(const char* name);

/// Reports `c` to the test process.
void report(char c);

/// Blocks until the test process says go on (or is gone).
void wait_for_parent();

}  // namespace arcpool::test
