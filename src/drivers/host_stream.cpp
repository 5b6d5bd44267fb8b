#include "drivers/host_stream.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

namespace arcpool::detail {
namespace {

thread_local bool t_in_host_work = false;
thread_local host_stream* t_running_stream = nullptr;

std::atomic<uint64_t> g_next_stream_id{1};

/// Every host stream of the process. Leaked on purpose: allocators destroyed during static
/// destruction may still reach it. An atexit hook joins the workers.
class stream_table {
 public:
  static stream_table& instance() {
    static stream_table* table = [] {
      auto* t = new stream_table();
      std::atexit([] { stream_table::instance().close_all(); });
      return t;
    }();
    return *table;
  }

  stream_handle create() {
    auto s = std::make_shared<host_stream>(g_next_stream_id.fetch_add(1));
    auto handle = reinterpret_cast<stream_handle>(s.get());
    std::vector<std::shared_ptr<host_stream>> reaped;  // joined after the lock, on return
    std::lock_guard<std::mutex> lock(mutex_);
    reap_locked(reaped);
    streams_.emplace(handle, std::move(s));
    return handle;
  }

  std::shared_ptr<host_stream> find(stream_handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle == legacy_default_stream() || handle == legacy_stream_alias()) {
      if (!legacy_) legacy_ = std::make_shared<host_stream>(g_next_stream_id.fetch_add(1));
      return legacy_;
    }
    auto it = streams_.find(handle);
    return it == streams_.end() ? nullptr : it->second;
  }

  bool destroy(stream_handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(handle);
    if (it == streams_.end()) return false;
    reserve_retirements_locked();
    retire_locked(std::move(it->second));
    streams_.erase(it);
    return true;
  }

  /// Every stream that may still run work: live ones, every thread's per-thread stream, and
  /// destroyed ones (and those of exited threads) still draining.
  std::vector<std::shared_ptr<host_stream>> all_running() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<host_stream>> all;
    for (auto& [handle, s] : streams_)
      all.push_back(s);
    all.insert(all.end(), per_thread_.begin(), per_thread_.end());
    all.insert(all.end(), retired_.begin(), retired_.end());
    if (legacy_) all.push_back(legacy_);
    return all;
  }

  /// A new per-thread default stream: counted among the live streams until its thread exits.
  std::shared_ptr<host_stream> create_per_thread() {
    auto s = std::make_shared<host_stream>(g_next_stream_id.fetch_add(1));
    std::lock_guard<std::mutex> lock(mutex_);
    per_thread_.reserve(per_thread_.size() + 1);
    reserve_retirements_locked(/*more=*/1);
    per_thread_.push_back(s);  // within the room reserved: no throw after the reserves
    return s;
  }

  /// Retires a per-thread default stream whose thread exits (its queued work still runs).
  void retire_per_thread(std::shared_ptr<host_stream> s) {
    std::vector<std::shared_ptr<host_stream>> reaped;  // joined after the lock, on return
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      reap_locked(reaped);  // best effort: a thread's exit (noexcept) runs this
    } catch (const std::bad_alloc&) {
    }
    if (auto it = std::find(per_thread_.begin(), per_thread_.end(), s); it != per_thread_.end()) {
      per_thread_.erase(it);
    }
    retire_locked(std::move(s));
  }

 private:
  // Room in retired_ for every stream that may be retired without a chance to allocate: each
  // live per-thread stream (retired at its thread's exit, which is noexcept), `more` to come,
  // and the one a destroy retires now. The room never shrinks.
  void reserve_retirements_locked(size_t more = 0) {
    retired_.reserve(retired_.size() + per_thread_.size() + more + 1);
  }

  void retire_locked(std::shared_ptr<host_stream> s) {
    s->close();
    retired_.push_back(std::move(s));
  }

  // Moves to `reaped` the retired streams whose worker ran everything and that nobody else
  // references: the caller destroys them after releasing the lock (their destructor joins the
  // worker, which has left its loop). A stream still draining stays: CUDA lets a destroyed
  // stream's work finish, and no call waits for it.
  void reap_locked(std::vector<std::shared_ptr<host_stream>>& reaped) {
    for (size_t i = 0; i < retired_.size();) {
      if (retired_[i].use_count() == 1 && retired_[i]->drained()) {
        reaped.push_back(std::move(retired_[i]));
        retired_[i] = std::move(retired_.back());
        retired_.pop_back();
      } else {
        ++i;
      }
    }
  }

  void close_all() {
    std::vector<std::shared_ptr<host_stream>> all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [handle, s] : streams_)
        all.push_back(s);
      all.insert(all.end(), retired_.begin(), retired_.end());
      all.insert(all.end(), per_thread_.begin(), per_thread_.end());
      if (legacy_) all.push_back(legacy_);
    }
    for (auto& s : all)
      s->close();
    for (auto& s : all)
      s->join();
  }

  std::mutex mutex_;
  std::unordered_map<stream_handle, std::shared_ptr<host_stream>> streams_;
  std::vector<std::shared_ptr<host_stream>> retired_;
  std::vector<std::shared_ptr<host_stream>> per_thread_;  ///< of the threads alive now
  std::shared_ptr<host_stream> legacy_;
};

/// The calling thread's per-thread default stream; retired when the thread exits.
struct per_thread_stream {
  std::shared_ptr<host_stream> stream;
  ~per_thread_stream() {
    if (stream) stream_table::instance().retire_per_thread(std::move(stream));
  }
};
thread_local per_thread_stream t_per_thread_stream;

}  // namespace

bool in_host_work() noexcept {
  return t_in_host_work;
}

host_stream::host_stream(uint64_t id) : id_(id), worker_([this] { run(); }) {}

host_stream::~host_stream() {
  join();
}

void host_stream::join() {
  close();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

void host_stream::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closing_) {
      queue_.push_back(std::move(task));
      ++enqueued_;
      work_cv_.notify_one();
      return;
    }
  }
  // Closed (process teardown): run in the caller, in order after everything queued before.
  synchronize();
  const bool was_in_work = std::exchange(t_in_host_work, true);
  task();
  t_in_host_work = was_in_work;
}

void host_stream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = enqueued_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
}

void host_stream::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closing_ = true;
  work_cv_.notify_one();
}

void host_stream::settle() {
  for (;;) {
    std::shared_ptr<host_stream> on;
    std::function<bool()> unblocked;
    uint64_t epoch = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [&] { return completed_ == enqueued_ || blocked_; });
      if (completed_ == enqueued_) return;
      if (!unblocked_) return;  // blocked on the test, with no way to tell when it ends
      on = blocked_on_.lock();
      unblocked = unblocked_;
      epoch = block_epoch_;
    }
    // Blocked on another stream: let it run as far as it can, unless the wait can end already
    // (its worker has not left it yet). If the wait still cannot end, nothing but the test can
    // unblock this stream. Only an unended wait is followed: it waits on an event recorded
    // before it, so the chain it starts goes back in time and ends. A satisfied one could lead
    // back here (that stream waited on this one's earlier event) for as long as its worker
    // takes to leave it, each time a level deeper, until the stack ran out.
    if (!unblocked()) {
      if (on) on->settle();
      if (!unblocked()) return;
    }
    // The wait ends: let the worker leave it, then settle again.
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return !blocked_ || block_epoch_ != epoch; });
  }
}

host_work_blocking::host_work_blocking() : stream_(t_running_stream) {
  if (stream_ == nullptr) return;
  std::lock_guard<std::mutex> lock(stream_->mutex_);
  stream_->blocked_ = true;
  ++stream_->block_epoch_;
  stream_->blocked_on_.reset();
  stream_->unblocked_ = nullptr;
  stream_->done_cv_.notify_all();
}

host_work_blocking::host_work_blocking(std::weak_ptr<host_stream> on,
                                       std::function<bool()> unblocked)
    : stream_(t_running_stream) {
  if (stream_ == nullptr) return;
  std::lock_guard<std::mutex> lock(stream_->mutex_);
  stream_->blocked_ = true;
  ++stream_->block_epoch_;
  stream_->blocked_on_ = std::move(on);
  stream_->unblocked_ = std::move(unblocked);
  stream_->done_cv_.notify_all();
}

host_work_blocking::~host_work_blocking() {
  if (stream_ == nullptr) return;
  std::lock_guard<std::mutex> lock(stream_->mutex_);
  stream_->blocked_ = false;
  stream_->blocked_on_.reset();
  stream_->unblocked_ = nullptr;
  stream_->done_cv_.notify_all();
}

void host_stream::run() {
  t_in_host_work = true;
  t_running_stream = this;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) {  // closing and drained
      drained_ = true;
      return;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // destroy captured state outside the lock too
    lock.lock();
    ++completed_;
    done_cv_.notify_all();
  }
}

std::shared_ptr<host_stream> host_stream_find(stream_handle s) {
  if (s == per_thread_default_stream()) {
    if (!t_per_thread_stream.stream) {
      t_per_thread_stream.stream = stream_table::instance().create_per_thread();
    }
    return t_per_thread_stream.stream;
  }
  return stream_table::instance().find(s);
}

stream_handle host_stream_create() {
  return stream_table::instance().create();
}

bool host_stream_destroy(stream_handle s) {
  return stream_table::instance().destroy(s);
}

void host_synchronize_all() {
  for (auto& s : stream_table::instance().all_running())
    s->synchronize();
}

}  // namespace arcpool::detail
