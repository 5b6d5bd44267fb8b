#include "ipc/channel.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "support/status.hpp"

namespace arcpool::detail::ipc {
namespace {

/// Room for the ancillary data of one message: a descriptor and credentials.
constexpr size_t kControlBytes = CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(ucred));

arcpool_status_t peer_gone(const char* what) {
  return fail(ARCPOOL_STATUS_PEER_GONE,
              "IPC connection: the other process closed the connection while %s (it exited, "
              "was killed, or destroyed its side)",
              what);
}

}  // namespace

channel::~channel() {
  if (fd_ >= 0) close(fd_);
}

arcpool_status_t channel::send(message m, int pass_fd, bool with_credentials) {
  m.magic = kMagic;
  iovec iov{&m, sizeof m};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[kControlBytes] = {};
  if (pass_fd >= 0 || with_credentials) {
    msg.msg_control = control;
    msg.msg_controllen = (pass_fd >= 0 ? CMSG_SPACE(sizeof(int)) : 0) +
                         (with_credentials ? CMSG_SPACE(sizeof(ucred)) : 0);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (pass_fd >= 0) {
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
      c = CMSG_NXTHDR(&msg, c);
    }
    if (with_credentials) {
      // unix(7), SCM_CREDENTIALS: the kernel checks them (a process sends its own process id
      // unless privileged) and gives the receiver the process id as its PID namespace sees it.
      const ucred self{getpid(), getuid(), getgid()};
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_CREDENTIALS;
      c->cmsg_len = CMSG_LEN(sizeof(ucred));
      std::memcpy(CMSG_DATA(c), &self, sizeof self);
    }
  }
  std::lock_guard<std::mutex> lock(send_mu_);
  return send_rest(m, 0, msg, iov);
}

bool channel::try_send(message m) noexcept {
  m.magic = kMagic;
  std::unique_lock<std::mutex> lock(send_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  iovec iov{&m, sizeof m};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  ssize_t n = -1;
  do {
    n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;  // gone, or failed: nothing to wait
  // A message is never left half sent: the other end would read the next one from its middle.
  if (static_cast<size_t>(n) < sizeof m) send_rest(m, static_cast<size_t>(n), msg, iov);
  return true;
}

arcpool_status_t channel::send_rest(message& m, size_t sent, msghdr& msg, iovec& iov) {
  while (sent < sizeof m) {
    iov.iov_base = reinterpret_cast<char*>(&m) + sent;
    iov.iov_len = sizeof m - sent;
    const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return peer_gone("sending");
    if (n < 0) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "IPC connection: sendmsg failed: %s",
                  std::strerror(errno));
    }
    sent += static_cast<size_t>(n);
    msg.msg_control = nullptr;  // the descriptor went with the first byte
    msg.msg_controllen = 0;
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t channel::receive_with_sender(message* m, pid_t* sender) {
  // unix(7), SO_PASSCRED: "Enabling this socket option causes receipt of the credentials of the
  // sending process in an SCM_CREDENTIALS ancillary message in each subsequently received
  // message." Off again after this one, so that no later message carries them.
  const int on = 1, off = 0;
  const bool passing = setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) == 0;
  const arcpool_status_t status = receive_any(m, nullptr, sender);
  if (passing) setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &off, sizeof off);
  return status;
}

arcpool_status_t channel::receive(message* m, int* received_fd) {
  return receive_any(m, received_fd, nullptr);
}

arcpool_status_t channel::receive_any(message* m, int* received_fd, pid_t* sender) {
  if (received_fd != nullptr) *received_fd = -1;
  if (sender != nullptr) *sender = 0;
  size_t got = 0;
  while (got < sizeof *m) {
    iovec iov{reinterpret_cast<char*>(m) + got, sizeof *m - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[kControlBytes] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return peer_gone("receiving");
    if (n < 0) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "IPC connection: recvmsg failed: %s",
                  std::strerror(errno));
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS && sender != nullptr &&
          c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
        ucred from{};
        std::memcpy(&from, CMSG_DATA(c), sizeof from);
        if (*sender == 0) *sender = from.pid;
        continue;
      }
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      // Every descriptor the message carries is installed in this process: the first one is
      // the caller's, and any other is closed (unexpected: never leak it).
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof fd, sizeof fd);
        if (received_fd != nullptr && *received_fd < 0) {
          *received_fd = fd;
        } else {
          close(fd);
        }
      }
    }
    got += static_cast<size_t>(n);
  }
  if (m->magic != kMagic) {
    if (received_fd != nullptr && *received_fd >= 0) {
      close(*received_fd);
      *received_fd = -1;  // closed: the caller, which closes what it got, must not close it again
    }
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "IPC connection: a message without arcpool's magic number (0x%x): the socket is "
                "not an arcpool connection",
                m->magic);
  }
  return ARCPOOL_STATUS_SUCCESS;
}

bool channel::readable() noexcept {
  message peek;
  ssize_t n = -1;
  do {
    n = recv(fd_, &peek, sizeof peek, MSG_PEEK | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof peek) || n == 0) return true;  // a message, or the end
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;            // an error to report
}

void channel::shut_down_sending() noexcept {
  shutdown(fd_, SHUT_WR);
}

}  // namespace arcpool::detail::ipc
