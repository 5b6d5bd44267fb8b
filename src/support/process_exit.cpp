#include "support/process_exit.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

namespace arcpool::detail {
namespace {

std::atomic<bool> g_exiting{false};

struct listener_table {
  std::mutex mutex;
  std::map<int, std::function<void()>> listeners;
  int next = 0;
  int running = -1;        ///< the token of the listener the exit hook runs now
  std::thread::id runner;  ///< the thread that runs it
  std::condition_variable returned;
};

// Leaked on purpose: it must outlive every static allocator.
listener_table& listeners() {
  static auto* table = new listener_table();
  return *table;
}

void on_exit() {
  g_exiting.store(true);
  // One listener at a time, each taken out of the table only when its turn comes: a listener
  // may remove a later one (its allocator's worker, joined, ran a callback that deleted another
  // allocator), which then must not run on its deleted owner.
  listener_table& table = listeners();
  for (;;) {
    std::function<void()> listener;
    {
      std::lock_guard<std::mutex> lock(table.mutex);
      if (table.listeners.empty()) return;
      const auto next = table.listeners.begin();
      listener = std::move(next->second);
      table.running = next->first;
      table.runner = std::this_thread::get_id();
      table.listeners.erase(next);
    }
    listener();
    std::lock_guard<std::mutex> lock(table.mutex);
    table.running = -1;
    table.returned.notify_all();
  }
}

}  // namespace

bool process_exiting() noexcept {
  return g_exiting.load(std::memory_order_relaxed);
}

void mark_process_exiting() noexcept {
  g_exiting.store(true);
}

void arm_exit_hook() noexcept {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(on_exit); });
}

int add_exit_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(listeners().mutex);
  const int token = listeners().next++;
  listeners().listeners.emplace(token, std::move(listener));
  return token;
}

void remove_exit_listener(int token) noexcept {
  listener_table& table = listeners();
  std::unique_lock<std::mutex> lock(table.mutex);
  table.listeners.erase(token);
  // Running on the exit hook's thread, it may still use its owner, which goes once this returns.
  table.returned.wait(
      lock, [&] { return table.running != token || table.runner == std::this_thread::get_id(); });
}

}  // namespace arcpool::detail
