// The messages of one IPC connection, over a connected AF_UNIX SOCK_STREAM socket
// (design.md §14).
#pragma once

#include <cstdint>
#include <mutex>

#include <sys/socket.h>
#include <sys/types.h>

#include "drivers/driver.hpp"

namespace arcpool::detail::ipc {

/// What a message says.
enum class message_kind : uint32_t {
  hello = 1,       ///< importer -> exporter, first, with the kernel-checked SCM_CREDENTIALS
                   ///< of its process (`id`: its process id as the importer sees it)
  pool = 2,        ///< exporter -> importer, carries the pool's file descriptor
  allocation = 3,  ///< exporter -> importer: `pointer`, `size`, `event` recorded after writes
  released = 4,    ///< importer -> exporter: import `id` freed; `event` follows that free
  event_done = 5,  ///< exporter -> importer: the `released` event of `id` was waited on
  goodbye = 6,     ///< exporter -> importer: nothing more will be sent
  refused = 7,     ///< importer -> exporter: allocation `id` could not be imported (no use)
};

/// The first field of every message a channel sends ("APC1"): a socket whose messages lack it
/// is not an arcpool connection.
constexpr uint32_t kMagic = 0x41504331;

/// One fixed-size message.
struct message {
  uint32_t magic = 0;
  message_kind kind = message_kind::hello;
  uint64_t id = 0;    ///< the allocation's number on this connection (hello: the process id)
  uint64_t size = 0;  ///< the allocation's bytes
  ipc_pointer_data pointer{};
  ipc_event_data event{};
};

/// One end of a connection: whole messages, written under a mutex (two threads may send).
class channel {
 public:
  /// Takes `fd` (closed by the destructor).
  explicit channel(int fd) noexcept : fd_(fd) {}
  ~channel();
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  /// Sends `m`, with `pass_fd` attached (SCM_RIGHTS) when not negative, and with this process's
  /// credentials (SCM_CREDENTIALS, checked by the kernel) when `with_credentials`. PEER_GONE
  /// when the other end closed; never raises SIGPIPE. Blocks while the other end does not read.
  arcpool_status_t send(message m, int pass_fd = -1, bool with_credentials = false);
  /// Sends `m` only if that cannot block: false, with nothing sent, when another thread is
  /// sending or the socket's buffer is full (true when sent, or when the other end is gone).
  bool try_send(message m) noexcept;
  /// Receives the next message, blocking; `*received_fd` (when given) gets an attached file
  /// descriptor or -1. PEER_GONE at end of file.
  arcpool_status_t receive(message* m, int* received_fd = nullptr);
  /// Receives the next message as receive() does, with its sender's process id as the kernel
  /// gives it in this process's PID namespace (SO_PASSCRED, on for this one message):
  /// `*sender` is 0 when the kernel gave none (the sender sent no credentials before the
  /// option was on, or its process is in a PID namespace this one cannot see).
  arcpool_status_t receive_with_sender(message* m, pid_t* sender);
  /// Whether receive() would return at once: a whole message has arrived, or the other end
  /// closed. Never blocks.
  bool readable() noexcept;
  /// Ends this side's sending: the other end reads end of file.
  void shut_down_sending() noexcept;
  /// Gives the socket back: the destructor will not close it (a failed create's caller keeps
  /// it).
  void release_fd() noexcept { fd_ = -1; }

 private:
  /// receive() and receive_with_sender(): `received_fd` and `sender` may each be null.
  arcpool_status_t receive_any(message* m, int* received_fd, pid_t* sender);
  /// Sends the rest of `m` from byte `sent`, blocking (the caller holds send_mu_).
  arcpool_status_t send_rest(message& m, size_t sent, msghdr& msg, iovec& iov);

  int fd_;
  std::mutex send_mu_;
};

}  // namespace arcpool::detail::ipc
