// Streams and their workers, the legacy stream's implicit synchronization, device barriers,
// the host's clock, and the seeded scheduler that delays completions.
#include <algorithm>
#include <chrono>

#include "state.hpp"

namespace simcuda {
namespace {

bool ready(const op& o) {
  return std::all_of(o.after.begin(), o.after.end(), [](const stream_point& p) { return done(p); });
}

/// The seeded scheduler: before an op completes, maybe a delay (longer with SIMCUDA_SLOW).
std::chrono::microseconds pick_delay(stream_obj& s) {
  const uint64_t x = s.rng();
  if (rt().cfg.slow) return std::chrono::microseconds(x % 2 == 0 ? (x >> 8) % 2000 : 0);
  return std::chrono::microseconds(x % 4 == 0 ? (x >> 8) % 100 : 0);
}

void worker(stream_obj* s) {
  runtime& r = rt();
  std::unique_lock<std::mutex> lock(r.mu);
  for (;;) {
    r.cv.wait(lock, [&] {
      return (!s->queue.empty() && ready(*s->queue.front())) || (s->destroyed && s->queue.empty());
    });
    if (s->queue.empty()) break;
    op* o = s->queue.front().get();
    const auto delay = pick_delay(*s);
    lock.unlock();
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (o->run && o->host_function) {
      std::lock_guard<std::mutex> one_at_a_time(r.host_functions);
      ts().in_host_function = true;
      o->run();
      ts().in_host_function = false;
    } else if (o->run) {
      o->run();
    }
    lock.lock();
    if (o->complete) o->complete();
    s->completed = o->seq;
    s->queue.pop_front();
    r.cv.notify_all();
  }
  // cudaStreamDestroy: "In case the device is still doing work in the stream stream when
  // cudaStreamDestroy() is called, the function will return immediately and the resources
  // associated with stream will be released automatically once the device has completed all
  // work in stream." The object stays as a tombstone so later uses are caught.
  device_obj& d = *r.devices[s->device];
  d.drained_clock.join(s->clock);
  d.streams.erase(std::remove(d.streams.begin(), d.streams.end(), s), d.streams.end());
}

}  // namespace

stream_obj* make_stream(device_obj& d, stream_obj::kind type, bool blocking) {
  runtime& r = rt();
  auto s = std::make_unique<stream_obj>();
  s->handle = new_handle();
  s->id = r.next_stream_id++;
  s->device = d.ordinal;
  s->context = reinterpret_cast<uintptr_t>(&d);  // cudaStreamCreateWithFlags: the current one
  s->type = type;
  s->blocking = blocking;
  s->rng.seed(r.cfg.seed * 0x9E3779B97F4A7C15ull + s->id);
  stream_obj* raw = s.get();
  r.streams.emplace(raw->handle, std::move(s));
  d.streams.push_back(raw);
  return raw;
}

bool done(stream_point p) {
  return p.stream == nullptr || p.stream->completed >= p.seq;
}

stream_obj* resolve_stream(cudaStream_t handle, bool per_thread_default, const char* call) {
  runtime& r = rt();
  const auto h = reinterpret_cast<uintptr_t>(handle);
  thread_state& t = ts();
  device_obj& d = context_device();
  // Programming guide, "Default Stream": with --default-stream per-thread (the _ptsz entry
  // points) the handle 0 is the per-thread default stream; cudaStreamLegacy is always the
  // legacy stream and cudaStreamPerThread always the calling thread's own stream.
  const bool per_thread =
      h == reinterpret_cast<uintptr_t>(cudaStreamPerThread) || (h == 0 && per_thread_default);
  if (per_thread) {
    stream_obj*& s = t.per_thread[d.ordinal];
    // The per-thread default stream "is not a non-blocking stream and will synchronize with
    // the legacy default stream if both are used in a program".
    if (s == nullptr) s = make_stream(d, stream_obj::kind::per_thread, /*blocking=*/true);
    return s;
  }
  if (h == 0 || h == reinterpret_cast<uintptr_t>(cudaStreamLegacy)) return d.legacy;
  auto it = r.streams.find(h);
  if (it == r.streams.end() || it->second->type != stream_obj::kind::created) {
    violation(
        format("%s: 0x%llx is not a stream handle", call, static_cast<unsigned long long>(h)));
    return nullptr;
  }
  if (it->second->destroyed) {
    violation(format("%s: use of destroyed %s", call, it->second->name().c_str()));
    return nullptr;
  }
  return it->second.get();
}

uint64_t enqueue(stream_obj& s, std::unique_ptr<op> o) {
  runtime& r = rt();
  device_obj& d = *r.devices[s.device];
  // cudaStreamCreateWithFlags, cudaStreamNonBlocking: "Specifies that work running in the
  // created stream may run concurrently with work in stream 0 (the NULL stream), and that the
  // created stream should perform no implicit synchronization with stream 0." Programming
  // guide, "Implicit Synchronization": the legacy default stream waits for all prior work in
  // blocking streams, and blocking streams wait for it.
  if (s.type == stream_obj::kind::legacy) {
    for (stream_obj* t : d.streams) {
      if (t == &s || !t->blocking || t->enqueued == 0) continue;
      o->after.push_back({t, t->enqueued});
      s.clock.join(t->clock);
    }
  } else if (s.blocking && d.legacy->enqueued > 0) {
    o->after.push_back({d.legacy, d.legacy->enqueued});
    s.clock.join(d.legacy->clock);
  }
  if (s.barrier_epoch != d.barrier_epoch) {
    for (const stream_point& p : d.barrier)
      if (p.stream != &s) o->after.push_back(p);
    s.clock.join(d.barrier_clock);
    s.barrier_epoch = d.barrier_epoch;
  }
  if (s.host_clock_version != r.host_clock_version) {
    s.clock.join(r.host_clock);
    s.host_clock_version = r.host_clock_version;
  }
  o->seq = ++s.enqueued;
  s.clock.raise(s.id, o->seq);
  const uint64_t seq = o->seq;
  s.queue.push_back(std::move(o));
  if (!s.worker_started) {
    s.worker_started = true;
    std::thread(worker, &s).detach();
  }
  r.cv.notify_all();
  return seq;
}

void settle(std::unique_lock<std::mutex>& lock, stream_obj& s, std::vector<stream_obj*>& path) {
  if (std::find(path.begin(), path.end(), &s) != path.end()) return;  // waits on itself
  path.push_back(&s);
  runtime& r = rt();
  while (!s.queue.empty()) {
    op& front = *s.queue.front();
    const uint64_t seq = front.seq;
    if (front.held && front.held()) break;  // only the host's write can end it
    if (ready(front)) {
      // Running, or about to: it completes without further events.
      r.cv.wait(lock, [&] { return s.completed >= seq || (front.held && front.held()); });
      continue;
    }
    std::vector<stream_obj*> waited_on;
    for (const stream_point& p : front.after)
      if (!done(p)) waited_on.push_back(p.stream);
    for (stream_obj* t : waited_on)
      settle(lock, *t, path);
    // The waits ended (the worker may have run `front` meanwhile), or they cannot end.
    if (!s.queue.empty() && s.queue.front()->seq == seq && !ready(*s.queue.front())) break;
  }
  path.pop_back();
}

void host_wait(std::unique_lock<std::mutex>& lock, stream_point p, const vclock& clock) {
  runtime& r = rt();
  r.cv.wait(lock, [&] { return done(p); });
  r.host_clock.join(clock);
  ++r.host_clock_version;
}

void device_barrier(device_obj& d, const char* why) {
  // Programming guide, "Implicit Synchronization": "Two commands from different streams cannot
  // run concurrently if any one of the following operations is issued in-between them by the
  // host thread: a page-locked host memory allocation, a device memory allocation, a device
  // memory set, a memory copy between two addresses to the same device memory, any CUDA
  // command to the NULL stream [...]".
  d.barrier.clear();
  d.barrier_clock = vclock();
  for (stream_obj* t : d.streams) {
    if (t->enqueued == t->completed) continue;
    d.barrier.push_back({t, t->enqueued});
    d.barrier_clock.join(t->clock);
    if (!t->queue.empty() && !t->queue.front()->what.empty() &&
        t->queue.front()->what.rfind("cuStreamWaitValue32", 0) == 0) {
      violation(
          format("%s synchronizes implicitly while %s is held by %s: all later work on "
                 "the device waits behind it",
                 why, t->name().c_str(), t->queue.front()->what.c_str()));
    }
  }
  ++d.barrier_epoch;
}

void device_wait(std::unique_lock<std::mutex>& lock, device_obj& d) {
  std::vector<stream_point> points;
  vclock clock = d.drained_clock;
  for (stream_obj* t : d.streams) {
    points.push_back({t, t->enqueued});
    clock.join(t->clock);
  }
  runtime& r = rt();
  r.cv.wait(lock, [&] {
    return std::all_of(points.begin(), points.end(), [](const stream_point& p) { return done(p); });
  });
  r.host_clock.join(clock);
  ++r.host_clock_version;
}

bool unsafe_prohibited() {
  // cudaThreadExchangeStreamCaptureMode: "cudaStreamCaptureModeGlobal: This is the default
  // mode. If the local thread has an ongoing capture sequence that was not initiated with
  // cudaStreamCaptureModeRelaxed at cuStreamBeginCapture, or if any other thread has a
  // concurrent capture sequence initiated with cudaStreamCaptureModeGlobal, this thread is
  // prohibited from potentially unsafe API calls." ThreadLocal: only the local thread's
  // captures count. Relaxed: "The local thread is not prohibited from potentially unsafe API
  // calls."
  const cudaStreamCaptureMode mode = ts().mode;
  if (mode == cudaStreamCaptureModeRelaxed) return false;
  const auto self = std::this_thread::get_id();
  for (const auto& c : rt().captures) {
    if (c->ended) continue;
    if (c->thread == self && c->mode != cudaStreamCaptureModeRelaxed) return true;
    if (mode == cudaStreamCaptureModeGlobal && c->thread != self &&
        c->mode == cudaStreamCaptureModeGlobal) {
      return true;
    }
  }
  return false;
}

void invalidate_prohibiting_captures() {
  const auto self = std::this_thread::get_id();
  for (const auto& c : rt().captures) {
    if (c->ended) continue;
    if ((c->thread == self && c->mode != cudaStreamCaptureModeRelaxed) ||
        (ts().mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal)) {
      c->invalidated = true;
    }
  }
}

capture_obj* blocking_capture_on(device_obj& d) {
  for (stream_obj* t : d.streams)
    if (t->capture != nullptr && t->blocking && !t->capture->ended) return t->capture;
  return nullptr;
}

capture_obj* live_capture_of(const event_obj& e) {
  if (e.captured_in == 0) return nullptr;
  for (const std::unique_ptr<capture_obj>& c : rt().captures)  // only captures not yet ended
    if (c->id == e.captured_in) return c.get();
  return nullptr;
}

}  // namespace simcuda
