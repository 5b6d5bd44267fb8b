#include "core/reclaimer.hpp"

#include <algorithm>
#include <new>
#include <utility>

#include "support/process_exit.hpp"
#include "support/status.hpp"

namespace arcpool::detail {

namespace {
/// True while this thread completes reclaim items or runs posted tasks (an on_free callback may
/// re-enter arcpool): a drain it makes then waits for neither.
thread_local bool t_completing = false;
}  // namespace

void run_before_free(driver& d, arcpool_before_free_t hook, void* user_data, void* pointer,
                     size_t bytes, stream_handle s) noexcept {
  struct call {
    arcpool_before_free_t hook;
    void* user_data;
    void* pointer;
    size_t bytes;
    stream_handle stream;
  } c{hook, user_data, pointer, bytes, s};
  d.run_on_device(
      [](void* context) {
        const call& k = *static_cast<const call*>(context);
        k.hook(k.pointer, k.bytes, k.stream, k.user_data);
      },
      &c);
}

reclaimer::reclaimer(driver& drv, event_pool& events, stats& counters, history& recorded,
                     arcpool_before_free_t before_free, void* before_free_user_data)
    : driver_(drv),
      events_(events),
      stats_(counters),
      history_(recorded),
      before_free_(before_free),
      before_free_user_data_(before_free_user_data) {}

arcpool_status_t reclaimer::free_on(reclaim_item& item, stream_handle s) {
  // The fences completed (a query or a synchronization saw them), so these waits cost the GPU
  // nothing; they put the free after the uses in stream order too, where tools that follow only
  // stream order see it: without them, compute-sanitizer's --track-stream-ordered-races reported
  // such frees as uses after free (all 100 it printed; bench/results/2026-12-04-h200).
  for (const fence_ref& f : item.fences)
    ARCPOOL_RETURN_IF_ERROR(driver_.stream_wait_event(s, f->event()));
  if (before_free_ != nullptr) {
    run_before_free(driver_, before_free_, before_free_user_data_, item.pointer, item.bytes, s);
  }
  return driver_.pool_free(item.pointer, item.bytes, s);
}

reclaimer::~reclaimer() {
  stop_worker(!process_exiting());
  int listener = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    listener = exit_listener_;
  }
  // Waits for the exit hook, if it is running the listener: it may still be inside stop_worker,
  // woken by this thread's join and not yet out of the mutex this destroys.
  if (listener >= 0) remove_exit_listener(listener);
  // Items left when the process exits: their memory goes with the process.
  while (queue_ != nullptr)
    delete std::exchange(queue_, queue_->next);
  while (spare_ != nullptr)
    delete std::exchange(spare_, spare_->next);
  if (have_stream_ && !process_exiting()) driver_.stream_destroy(stream_);
}

void reclaimer::stop_worker(bool drain_first) {
  if (drain_first) drain(/*final=*/true);
  std::thread worker;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stop_ = true;
    work_cv_.notify_all();
    worker = std::move(worker_);
    if (!worker.joinable()) {
      // Another thread is joining the worker: the reclaimer may go only once it exited.
      if (worker_id_ != std::this_thread::get_id()) {
        idle_cv_.wait(lock, [&] { return !joining_; });
      }
      return;
    }
    joining_ = true;
  }
  if (worker.get_id() == std::this_thread::get_id()) {
    worker.detach();  // the last allocator reference went from inside an on_free callback
  } else {
    worker.join();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  joining_ = false;
  idle_cv_.notify_all();
}

std::unique_ptr<reclaim_item> reclaimer::prepare() {
  std::unique_ptr<reclaim_item> item;
  {
    std::lock_guard<spinlock> lock(spare_lock_);
    if (spare_ != nullptr) {
      item.reset(std::exchange(spare_, spare_->next));
      --spare_count_;
    }
  }
  if (!item) item = std::make_unique<reclaim_item>();
  start();
  return item;
}

void reclaimer::start() {
  if (started_.load(std::memory_order_acquire)) return;  // once: the worker's lock left alone
  std::lock_guard<std::mutex> lock(mutex_);
  start_locked();
}

void reclaimer::recycle(std::unique_ptr<reclaim_item> item) noexcept {
  *item = reclaim_item();  // its fences go now
  std::lock_guard<spinlock> lock(spare_lock_);
  if (spare_count_ == kSpareItems) return;  // deleted, once the lock is released
  item->next = spare_;
  spare_ = item.release();
  ++spare_count_;
}

void reclaimer::enqueue(std::unique_ptr<reclaim_item> item) noexcept {
  if (item->on_free == nullptr && !item->graph) stats_.add(stat::bytes_pending_free, item->bytes);
  stats_.count(stat::deferred_frees);
  if (item->counted_on != nullptr) item->counted_on->deferred_free();
  std::lock_guard<std::mutex> lock(mutex_);
  item->next = queue_;
  queue_ = item.release();
  ++queued_;
  work_cv_.notify_one();
}

void reclaimer::expect_post() noexcept {
  inbox_.expect(mutex_, work_cv_);
}

void reclaimer::post(posted_task* task) noexcept {
  inbox_.post(task, work_cv_);
}

bool reclaimer::run_posted() {
  posted_task* task = inbox_.take();
  if (task == nullptr) return false;
  const bool was_completing = std::exchange(t_completing, true);
  while (task != nullptr) {
    posted_task* next = task->next;
    task->run(task);  // may free the task, and enqueue
    inbox_.finished();
    task = next;
  }
  t_completing = was_completing;
  // Through the mutex: a drain that read the tasks unfinished is waiting by now (drain).
  { std::lock_guard<std::mutex> passed_through(mutex_); }
  idle_cv_.notify_all();
  return true;
}

size_t reclaimer::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_ + completing_ + inbox_.unfinished();
}

void reclaimer::start_locked() {
  // Deterministic mode: no thread; items complete on the threads that poll, trim or drain.
  if (worker_.joinable() || stop_ || !driver_.allows_worker_threads()) {
    started_.store(true, std::memory_order_release);
    return;
  }
  // The listener first: if the thread cannot start, a later call starts it, with the listener.
  if (exit_listener_ < 0) exit_listener_ = add_exit_listener([this] { stop_worker(false); });
  worker_ = std::thread([this] { run(); });
  worker_id_ = worker_.get_id();
  started_.store(true, std::memory_order_release);
}

arcpool_status_t reclaimer::reclaim_stream(stream_handle* out) {
  std::lock_guard<std::mutex> lock(stream_mutex_);
  if (!have_stream_) {
    ARCPOOL_RETURN_IF_ERROR(driver_.stream_create(&stream_));
    have_stream_ = true;
  }
  *out = stream_;
  return ARCPOOL_STATUS_SUCCESS;
}

bool reclaimer::take_late_fences(reclaim_item& item, bool* failed) {
  while (!item.fence_later.empty()) {
    const stream_ref& s = item.fence_later.back();
    fence_ref f;
    bool capturing = false;
    const std::optional<arcpool_status_t> status = s.entry->with_alive(
        [&](stream_handle h) { return events_.record_outside_capture(h, s.id, &f, &capturing); });
    if (!status) {
      f = s.entry->final_fence();  // retired: its final fence covers all its work
    } else if (*status != ARCPOOL_STATUS_SUCCESS) {
      *failed = true;
      return true;
    } else if (capturing) {
      return false;  // capturing again: a later pass fences it
    }
    item.fences.push_back(std::move(f));  // into the room reserved for it: no allocation
    item.fence_later.pop_back();
  }
  return true;
}

bool reclaimer::poll(reclaim_item& item, bool* failed) {
  if (!take_late_fences(item, failed)) return false;
  if (*failed) return true;
  // Completed fences stay in the item until the free waits on them (free_on).
  for (; item.fences_completed < item.fences.size(); ++item.fences_completed) {
    bool done = false;
    if (driver_.event_query(item.fences[item.fences_completed]->event(), &done) !=
        ARCPOOL_STATUS_SUCCESS) {
      *failed = true;
      return true;
    }
    if (!done) return false;
  }
  return true;
}

void reclaimer::complete(reclaim_item& item, bool failed, bool prefer_origin) {
  if (item.on_free != nullptr) {
    item.fences.clear();
    if (failed) {
      // on_free says that arcpool's uses are over, which a fence that could not be checked (or
      // taken) leaves unknown: a stream may still use the memory. Never said, then; counted, as
      // pool memory is written off rather than freed under a use.
      stats_.count(stat::reclaim_failures);
      return;
    }
    // Exactly once, outside every lock; a throwing callback must not take the worker down.
    try {
      item.on_free(item.pointer, item.bytes, item.on_free_user_data);
    } catch (...) {
    }
    return;
  }
  if (!item.graph) stats_.sub(stat::bytes_pending_free, item.bytes);
  // The block leaves arcpool here, freed or lost: recorded before another thread can get it.
  history_.segment_free(item.pointer, item.origin.handle);
  const int64_t held = item.graph ? 0 : static_cast<int64_t>(item.bytes);
  if (failed || process_exiting()) {
    if (failed) stats_.count(stat::reclaim_failures);
    stats_.sub(stat::bytes_held, held);
    return;
  }
  arcpool_status_t status = ARCPOOL_STATUS_UNSUPPORTED;
  // The host driver makes streams and queues waits and frees as host work, which may find no
  // host memory (std::bad_alloc), here on the worker or inside a drain: the free fails then,
  // written off and counted as a failed CUDA call's is, and nothing escapes.
  try {
    if (prefer_origin && item.origin.entry) {
      status =
          item.origin.entry
              ->with_alive([&](stream_handle origin) {
                bool capturing = true;
                if (driver_.stream_is_capturing(origin, &capturing) != ARCPOOL_STATUS_SUCCESS ||
                    capturing) {
                  return ARCPOOL_STATUS_UNSUPPORTED;
                }
                return free_on(item, origin);
              })
              .value_or(ARCPOOL_STATUS_UNSUPPORTED);
    }
    if (status == ARCPOOL_STATUS_SUCCESS) {
      if (item.routed_to_origin) stats_.count(stat::origin_routed_frees);
    } else {
      stream_handle s = nullptr;
      status = reclaim_stream(&s);
      if (status == ARCPOOL_STATUS_SUCCESS) status = free_on(item, s);
      // Counted once the fallback's free is made, and only when the origin was tried: a drain
      // frees on the reclaim stream on purpose.
      if (status == ARCPOOL_STATUS_SUCCESS && prefer_origin && item.routed_to_origin) {
        stats_.count(stat::origin_fallbacks);
      }
    }
  } catch (const std::bad_alloc&) {
    status = ARCPOOL_STATUS_OUT_OF_MEMORY;
  }
  if (status == ARCPOOL_STATUS_SUCCESS) {
    stats_.count(stat::frees);
  } else {
    stats_.count(stat::reclaim_failures);
  }
  stats_.sub(stat::bytes_held, held);
}

reclaim_item* reclaimer::take_completed_locked() {
  // Queries never block, so they run under the lock; completion runs outside it.
  reclaim_item* done = nullptr;
  size_t taken = 0;
  for (reclaim_item** link = &queue_; *link != nullptr;) {
    reclaim_item* item = *link;
    bool failed = false;
    if (poll(*item, &failed)) {
      *link = item->next;
      item->failed = failed;
      item->next = done;
      done = item;
      ++taken;
    } else {
      link = &item->next;
    }
  }
  queued_ -= taken;
  completing_ += taken;
  return done;
}

size_t reclaimer::finish(reclaim_item* done) {
  if (done == nullptr) return 0;
  const bool was_completing = std::exchange(t_completing, true);
  size_t finished = 0;
  while (done != nullptr) {
    std::unique_ptr<reclaim_item> item(std::exchange(done, done->next));
    complete(*item, item->failed, /*prefer_origin=*/true);
    recycle(std::move(item));
    ++finished;
  }
  t_completing = was_completing;
  std::lock_guard<std::mutex> lock(mutex_);
  completing_ -= finished;
  idle_cv_.notify_all();
  return finished;
}

size_t reclaimer::poll_once() {
  run_posted();
  reclaim_item* done = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done = take_completed_locked();
  }
  return finish(done);
}

void reclaimer::run() {
  driver_.enter_reclaim_thread();
  std::unique_lock<std::mutex> lock(mutex_);
  auto backoff = kMinBackoff;
  for (;;) {
    if (stop_ || process_exiting()) return;
    if (inbox_.has_tasks()) {
      lock.unlock();
      run_posted();
      lock.lock();
      continue;
    }
    if (queue_ == nullptr) {
      inbox_.wait_idle(lock, work_cv_, [&] { return stop_ || queue_ != nullptr; });
      backoff = kMinBackoff;
      continue;
    }
    reclaim_item* done = take_completed_locked();
    if (done == nullptr) {
      work_cv_.wait_for(lock, backoff);
      backoff = std::min(backoff * 2, kMaxBackoff);
      continue;
    }
    lock.unlock();
    finish(done);
    lock.lock();
    backoff = kMinBackoff;
  }
}

arcpool_status_t reclaimer::drain(bool final) {
  reclaim_item* items = nullptr;
  size_t taken = 0;
  for (;;) {
    run_posted();
    std::unique_lock<std::mutex> lock(mutex_);
    // Frees being completed right now (by the worker, a poll or another drain) must land
    // before we report, and so must those that posted tasks running now enqueue (a graph's
    // deferred frees, a graph pool's blocks); not when this thread is one of those completing
    // (an on_free callback that allocated and ran out of memory). A task posted since this
    // thread looked is run here: no worker may be there to take it.
    if (!t_completing) {
      auto settled = [&] {
        return completing_ == 0 && (inbox_.unfinished() == 0 || inbox_.has_tasks());
      };
      // A post wakes the worker alone, without the mutex: look again every kRecheck.
      while (!idle_cv_.wait_for(lock, task_inbox::kRecheck, settled)) {
      }
      if (inbox_.has_tasks()) continue;
    }
    items = std::exchange(queue_, nullptr);
    taken = std::exchange(queued_, 0);
    completing_ += taken;
    break;
  }
  const bool was_completing = std::exchange(t_completing, true);
  arcpool_status_t first_error = ARCPOOL_STATUS_SUCCESS;
  bool freed = false;
  reclaim_item* later = nullptr;
  size_t kept = 0;
  while (items != nullptr) {
    std::unique_ptr<reclaim_item> item(std::exchange(items, items->next));
    bool failed = false;
    if (!take_late_fences(*item, &failed)) {
      if (!final) {  // a later pass fences the stream once its capture ended
        item->next = later;
        later = item.release();
        ++kept;
        continue;
      }
      failed = true;  // the streams go: the memory is given up (counted)
    }
    for (auto& f : item->fences) {
      if (driver_.event_synchronize(f->event()) != ARCPOOL_STATUS_SUCCESS) failed = true;
    }
    if (failed && first_error == ARCPOOL_STATUS_SUCCESS) first_error = ARCPOOL_STATUS_CUDA_ERROR;
    freed = freed || item->on_free == nullptr;
    complete(*item, failed, /*prefer_origin=*/false);
    recycle(std::move(item));
  }
  // Also when this drain freed nothing: the frees other passes (the worker's) completed before
  // it, and queued on the reclaim stream, must have run too when it returns.
  bool made = false;
  {
    std::lock_guard<std::mutex> lock(stream_mutex_);
    made = have_stream_;
  }
  if (freed || made) {
    stream_handle s = nullptr;
    if (reclaim_stream(&s) == ARCPOOL_STATUS_SUCCESS) {
      const arcpool_status_t status = driver_.stream_synchronize(s);
      if (first_error == ARCPOOL_STATUS_SUCCESS) first_error = status;
    }
  }
  t_completing = was_completing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completing_ -= taken;
    while (later != nullptr) {
      reclaim_item* const item = std::exchange(later, later->next);
      item->next = queue_;
      queue_ = item;
    }
    queued_ += kept;
    if (kept != 0) work_cv_.notify_one();
    idle_cv_.notify_all();
  }
  return first_error;
}

}  // namespace arcpool::detail
