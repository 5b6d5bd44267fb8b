#include "support/ipc_processes.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "support/driver_test.hpp"

extern char** environ;

namespace arcpool::test {

child spawn_child(const char* role, std::vector<std::string> extra_env) {
  int sv[2], pv[2];
  child c;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0 ||
      socketpair(AF_UNIX, SOCK_STREAM, 0, pv) != 0) {
    ADD_FAILURE() << "socketpair: " << std::strerror(errno);
    return c;
  }
  const std::string filter = std::string("--gtest_filter=IpcChild.DISABLED_") + role;
  std::vector<std::string> env_strings = {"ARCPOOL_IPC_SOCKET=" + std::to_string(sv[1]),
                                          "ARCPOOL_IPC_PIPE=" + std::to_string(pv[1])};
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "ARCPOOL_IPC_", 12) != 0) env.push_back(*e);
  }
  for (std::string& s : extra_env)
    env_strings.push_back(std::move(s));
  for (std::string& s : env_strings)
    env.push_back(s.data());
  env.push_back(nullptr);
  std::string exe = "/proc/self/exe", also = "--gtest_also_run_disabled_tests";
  std::string filter_arg = filter;
  char* argv[] = {exe.data(), filter_arg.data(), also.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, sv[0]);
  posix_spawn_file_actions_addclose(&actions, pv[0]);
  const int rc = posix_spawn(&c.pid, exe.c_str(), &actions, nullptr, argv, env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(sv[1]);
  close(pv[1]);
  if (rc != 0) ADD_FAILURE() << "posix_spawn: " << std::strerror(rc);
  c.socket = sv[0];
  c.pipe = pv[0];
  return c;
}

char read_report(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 60000) != 1) return '\0';
  char c = '\0';
  return read(fd, &c, 1) == 1 ? c : '\0';
}

int reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

size_t outstanding(arcpool_ipc_exporter_t* e) {
  size_t n = 0;
  EXPECT_OK(arcpool_ipc_exporter_outstanding(e, &n));
  return n;
}

int env_fd(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? -1 : std::atoi(v);
}

void report(char c) {
  ASSERT_EQ(1, write(env_fd("ARCPOOL_IPC_PIPE"), &c, 1));
}

void wait_for_parent() {
  read_report(env_fd("ARCPOOL_IPC_PIPE"));
}

}  // namespace arcpool::test
