// Runtime entry points for streams, events, host functions and stream capture.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "state.hpp"

namespace simcuda {

bool capture_node(stream_obj& s, const std::string& what, cudaError_t* error, graph_node** node) {
  if (s.capture == nullptr) {
    // cudaStreamIsCapturing: "When a blocking stream is capturing, the legacy stream is in an
    // unusable state until the blocking stream capture is terminated. The legacy stream is not
    // supported for stream capture, but attempted use would have an implicit dependency on the
    // capturing stream(s)." driver_types.h, cudaErrorStreamCaptureImplicit: "The operation
    // would have resulted in a disallowed implicit dependency on a current capture sequence
    // from cudaStreamLegacy."
    if (s.type == stream_obj::kind::legacy) {
      if (capture_obj* c = blocking_capture_on(*rt().devices[s.device])) {
        c->invalidated = true;
        *error = cudaErrorStreamCaptureImplicit;
        return true;
      }
    }
    return false;
  }
  capture_obj& c = *s.capture;
  if (c.invalidated) {
    // cudaErrorStreamCaptureInvalidated: "The current capture sequence on the stream has been
    // invalidated due to a previous error."
    *error = cudaErrorStreamCaptureInvalidated;
    return true;
  }
  // cudaStreamGetCaptureInfo, dependencies_out: "The next node to be captured in the stream
  // will depend on this set of nodes, absent operations such as event wait which modify this
  // set."
  graph_obj& g = *c.graph;
  graph_node n;
  n.what = what;
  std::vector<size_t>& tail = c.tails[&s];
  n.deps = tail;
  n.branch =
      static_cast<size_t>(std::find(c.streams.begin(), c.streams.end(), &s) - c.streams.begin());
  g.nodes.push_back(std::move(n));
  tail.assign(1, g.nodes.size() - 1);
  if (node != nullptr) *node = &g.nodes.back();
  *error = cudaSuccess;
  return true;
}

void check_unsafe_unverified(const char* call) {
  if (unsafe_prohibited()) {
    unverified(format("%s is a potentially unsafe call while a capture prohibits them", call));
  }
}

namespace {

event_obj* resolve_event(cudaEvent_t e, const char* call) {
  auto it = rt().events.find(reinterpret_cast<uintptr_t>(e));
  if (it == rt().events.end()) {
    violation(format("%s: %p is not an event handle", call, static_cast<void*>(e)));
    return nullptr;
  }
  if (it->second->destroyed) {
    violation(format("%s: use of destroyed event %p", call, static_cast<void*>(e)));
    return nullptr;
  }
  return it->second.get();
}

/// The programming guide, "Prohibited and Unhandled Operations": "It is invalid to synchronize
/// or query the execution status of a stream which is being captured or a captured event,
/// because they do not represent items scheduled for execution." The capture is invalidated.
cudaError_t refuse_in_capture(capture_obj* c) {
  c->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

/// The same rule for a query or synchronization of an event recorded in capture `c`:
/// driver_types.h, cudaErrorCapturedEvent: "The operation is not permitted on an event which was
/// last recorded in a capturing stream." The capture is invalidated.
cudaError_t refuse_captured_event(capture_obj* c) {
  c->invalidated = true;
  return cudaErrorCapturedEvent;
}

cudaError_t stream_synchronize(cudaStream_t handle, bool ptds) {
  SIMCUDA_ENTER("cudaStreamSynchronize");
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamSynchronize");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return ret(refuse_in_capture(s->capture));
  cudaError_t e = cudaSuccess;
  if (s->type == stream_obj::kind::legacy && capture_node(*s, "", &e)) return ret(e);
  check_unsafe_unverified("cudaStreamSynchronize");
  const vclock clock = s->clock;  // what the host learns: this point, not later enqueues
  host_wait(lock, {s, s->enqueued}, clock);
  // driver_types.h, cudaMemPoolAttrReleaseThreshold: "When more than the release threshold
  // bytes of memory are held by the memory pool, the allocator will try to release memory back
  // to the OS on the next call to stream, event or context synchronize."
  apply_release_thresholds(*r.devices[s->device]);
  return cudaSuccess;
}

cudaError_t stream_query(cudaStream_t handle, bool ptds) {
  SIMCUDA_ENTER("cudaStreamQuery");
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamQuery");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return ret(refuse_in_capture(s->capture));
  if (!done({s, s->enqueued})) return ret(cudaErrorNotReady);
  r.host_clock.join(s->clock);
  ++r.host_clock_version;
  return cudaSuccess;
}

cudaError_t stream_get_id(cudaStream_t handle, unsigned long long* id, bool ptds) {
  SIMCUDA_ENTER("cudaStreamGetId");
  if (id == nullptr) return ret(cudaErrorInvalidValue);
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamGetId");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) unverified("cudaStreamGetId on a capturing stream");
  // cudaStreamGetId: "Returns in streamId the unique Id of the stream in the process."
  *id = s->id;
  return cudaSuccess;
}

cudaError_t stream_get_device(cudaStream_t handle, int* device, bool ptds) {
  SIMCUDA_ENTER("cudaStreamGetDevice");
  if (device == nullptr) return ret(cudaErrorInvalidValue);
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamGetDevice");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  // cudaStreamGetDevice: "Returns in device the device of the stream."
  *device = s->device;
  return cudaSuccess;
}

cudaError_t stream_is_capturing(cudaStream_t handle, cudaStreamCaptureStatus* status, bool ptds) {
  SIMCUDA_ENTER("cudaStreamIsCapturing");
  if (status == nullptr) return ret(cudaErrorInvalidValue);
  // Before the handle is looked at: another thread may destroy the stream meanwhile, as it may
  // between a caller's check that the stream lives and the call.
  pause_point(lock, "cudaStreamIsCapturing");
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamIsCapturing");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  // "Note that, if this is called on cudaStreamLegacy (the "null stream") while a blocking
  // stream on the same device is capturing, it will return cudaErrorStreamCaptureImplicit
  // [...]. The blocking stream capture is not invalidated."
  if (s->type == stream_obj::kind::legacy && blocking_capture_on(*r.devices[s->device])) {
    return ret(cudaErrorStreamCaptureImplicit);
  }
  if (s->capture == nullptr) {
    *status = cudaStreamCaptureStatusNone;
  } else {
    *status = s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  }
  return cudaSuccess;
}

cudaError_t stream_get_capture_info(cudaStream_t handle, cudaStreamCaptureStatus* status,
                                    unsigned long long* id, cudaGraph_t* graph,
                                    const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                    size_t* count, bool ptds) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t e = stream_is_capturing(handle, &st, ptds);
  if (e != cudaSuccess) return e;
  if (status == nullptr) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(rt().mu);
  *status = st;
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamGetCaptureInfo");
  if (id != nullptr && s != nullptr && s->capture != nullptr) *id = s->capture->id;
  // graph_out: "the graph being captured into. All operations other than destroy and node
  // removal are permitted on the graph while the capture sequence is in progress."
  if (graph != nullptr) {
    *graph = s != nullptr && s->capture != nullptr
                 ? reinterpret_cast<cudaGraph_t>(s->capture->graph->handle)
                 : nullptr;
  }
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (count != nullptr) *count = 0;
  return cudaSuccess;
}

cudaError_t stream_begin_capture(cudaStream_t handle, cudaStreamCaptureMode mode, bool ptds) {
  SIMCUDA_ENTER("cudaStreamBeginCapture");
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamBeginCapture");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  // cudaStreamBeginCapture: "Capture may not be initiated if stream is cudaStreamLegacy."
  if (s->type == stream_obj::kind::legacy) return ret(cudaErrorStreamCaptureUnsupported);
  if (s->capture != nullptr) return ret(cudaErrorIllegalState);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return ret(cudaErrorInvalidValue);
  }
  auto c = std::make_unique<capture_obj>();
  c->id = r.next_capture_id++;
  c->origin = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->streams.push_back(s);
  c->tails[s] = {};
  c->graph = make_graph(s->device);
  s->capture = c.get();
  r.captures.push_back(std::move(c));
  return cudaSuccess;
}

void end_capture_sequence(capture_obj& c) {
  c.ended = true;
  for (stream_obj* s : c.streams)
    s->capture = nullptr;
  auto& all = rt().captures;
  all.erase(std::remove_if(all.begin(), all.end(),
                           [&](const std::unique_ptr<capture_obj>& p) { return p.get() == &c; }),
            all.end());
}

/// Whether every captured stream's last nodes are joined back into the origin stream: each is
/// an ancestor of (or one of) the origin's last nodes.
bool joined(const capture_obj& c) {
  const std::vector<graph_node>& nodes = c.graph->nodes;
  std::vector<bool> reached(nodes.size(), false);
  std::vector<size_t> todo = c.tails.at(c.origin);
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (reached[n]) continue;
    reached[n] = true;
    todo.insert(todo.end(), nodes[n].deps.begin(), nodes[n].deps.end());
  }
  for (const auto& [stream, tail] : c.tails)
    for (size_t n : tail)
      if (!reached[n]) return false;
  return true;
}

cudaError_t stream_end_capture(cudaStream_t handle, cudaGraph_t* graph, bool ptds) {
  SIMCUDA_ENTER("cudaStreamEndCapture");
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  *graph = nullptr;
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamEndCapture");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (s->capture == nullptr) return ret(cudaErrorIllegalState);
  capture_obj& c = *s->capture;
  // driver_types.h, cudaErrorStreamCaptureUnmatched: "The capture was not initiated in this
  // stream."
  if (c.origin != s) return ret(cudaErrorStreamCaptureUnmatched);
  // cudaErrorStreamCaptureWrongThread: "A stream capture sequence not initiated with the
  // cudaStreamCaptureModeRelaxed argument to cudaStreamBeginCapture was passed to
  // cudaStreamEndCapture in a different thread."
  // The refused end still ends the sequence, its graph dropped: on an H200 (CUDA 13.0, driver
  // 580.159.04; bench/results/2026-12-04-h200) the stream captured no more afterwards, and its
  // own thread's end answered cudaErrorIllegalState.
  if (c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::this_thread::get_id()) {
    graph_obj* g = c.graph;
    end_capture_sequence(c);
    drop_graph(*g);
    return ret(cudaErrorStreamCaptureWrongThread);
  }
  // cudaStreamEndCapture: "If the capture was invalidated, due to a violation of the rules of
  // stream capture, then a NULL graph will be returned."
  const bool unjoined = !joined(c);
  const bool invalidated = c.invalidated;
  graph_obj* g = c.graph;
  g->branches = c.streams.size();
  end_capture_sequence(c);
  // cudaErrorStreamCaptureUnjoined: "The capture sequence contains a fork that was not joined
  // to the primary stream."
  if (invalidated || unjoined) {
    drop_graph(*g);
    return ret(invalidated ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureUnjoined);
  }
  g->captured = true;
  *graph = reinterpret_cast<cudaGraph_t>(g->handle);
  return cudaSuccess;
}

cudaError_t launch_host_func(cudaStream_t handle, cudaHostFn_t fn, void* data, bool ptds) {
  SIMCUDA_ENTER("cudaLaunchHostFunc");
  if (fn == nullptr) return ret(cudaErrorInvalidValue);
  stream_obj* s = resolve_stream(handle, ptds, "cudaLaunchHostFunc");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t e = cudaSuccess;
  graph_node* node = nullptr;
  if (capture_node(*s, "host function", &e, &node)) {
    if (node != nullptr) {
      node->run = [fn, data] { fn(data); };
      node->host_function = true;
    }
    return ret(e);
  }
  auto o = std::make_unique<op>();
  o->what = "cudaLaunchHostFunc";
  o->host_function = true;
  // cudaLaunchHostFunc: "Host functions execute in the order they are enqueued on the stream"
  // and "The host function will be called after currently enqueued work and will block work
  // added after it."
  o->run = [fn, data] { fn(data); };
  enqueue(*s, std::move(o));
  return cudaSuccess;
}

cudaError_t event_record(cudaEvent_t ev, cudaStream_t handle, bool ptds) {
  SIMCUDA_ENTER("cudaEventRecord");
  event_obj* e = resolve_event(ev, "cudaEventRecord");
  if (e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  stream_obj* s = resolve_stream(handle, ptds, "cudaEventRecord");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  // cudaEventRecord: "event and stream must be on the same CUDA context"; cuEventRecord: "hEvent
  // and hStream must be from the same context otherwise CUDA_ERROR_INVALID_HANDLE is returned".
  // Created streams carry their context. Default streams are their device's primary context's
  // here (simcuda gives a cuCtxCreate context no default streams of its own), so an event of
  // another device's primary context is refused on them; one of a cuCtxCreate context is not
  // checked.
  const bool primary_event = std::any_of(
      rt().devices.begin(), rt().devices.end(),
      [&](const auto& d) { return e->context == reinterpret_cast<uintptr_t>(d.get()); });
  if (e->context != 0 && e->context != s->context &&
      (s->type == stream_obj::kind::created || primary_event)) {
    return ret(cudaErrorInvalidResourceHandle);
  }
  cudaError_t err = cudaSuccess;
  if (capture_node(*s, "event record", &err)) {
    if (err != cudaSuccess) return ret(err);
    e->recorded = true;
    e->captured_in = s->capture->id;
    e->captured_tail = s->capture->tails[s];
    return cudaSuccess;
  }
  // cudaEventRecord: "Captures in event the contents of stream at the time of this call. [...]
  // Calls such as cudaEventQuery() or cudaStreamWaitEvent() will then examine or wait for
  // completion of the work that was captured. Uses of stream after this call do not modify
  // event."
  auto o = std::make_unique<op>();
  o->what = "cudaEventRecord";
  if (e->shared != nullptr) ipc_event_record(*e, *o);
  const uint64_t seq = enqueue(*s, std::move(o));
  e->recorded = true;
  e->captured_in = 0;
  e->point = {s, seq};
  e->clock = s->clock;
  return cudaSuccess;
}

cudaError_t stream_wait_event(cudaStream_t handle, cudaEvent_t ev, unsigned flags, bool ptds) {
  SIMCUDA_ENTER("cudaStreamWaitEvent");
  stream_obj* s = resolve_stream(handle, ptds, "cudaStreamWaitEvent");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  event_obj* e = resolve_event(ev, "cudaStreamWaitEvent");
  if (e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (e->opened) return ret(ipc_event_wait(*s, *e));
  if (capture_obj* c = live_capture_of(*e)) {
    // The programming guide, "Invalidation": "When a capture graph is invalidated, further use
    // of any streams which are being captured or captured events associated with the graph is
    // invalid and will return an error".
    if (c->invalidated) return ret(cudaErrorStreamCaptureInvalidated);
    if (s->capture != nullptr && s->capture != c) {
      // "It is invalid to merge two separate capture graphs by waiting on a captured event from
      // a stream which is being captured and is associated with a different capture graph"
      // (programming guide); cudaErrorStreamCaptureMerge: "The operation would have resulted
      // in a merge of two independent capture sequences". Both captures are associated.
      s->capture->invalidated = true;
      c->invalidated = true;
      return ret(cudaErrorStreamCaptureMerge);
    }
    if (s->type == stream_obj::kind::legacy) {
      // "Stream capture can be used on any CUDA stream except cudaStreamLegacy" (programming
      // guide): the legacy stream cannot join a capture. cudaErrorStreamCaptureImplicit: "The
      // operation would have resulted in a disallowed implicit dependency on a current capture
      // sequence from cudaStreamLegacy" (unverified: the code a GPU answers).
      c->invalidated = true;
      return ret(cudaErrorStreamCaptureImplicit);
    }
    if (s->capture == nullptr) {  // a fork: s joins the capture
      s->capture = c;
      c->streams.push_back(s);
      c->tails[s] = {};
    }
    // Within a capture a wait is an edge: the stream's next node also depends on the record's.
    std::vector<size_t>& tail = c->tails[s];
    for (size_t n : e->captured_tail)
      if (std::find(tail.begin(), tail.end(), n) == tail.end()) tail.push_back(n);
    return cudaSuccess;
  }
  if (s->capture != nullptr) {
    // cudaStreamWaitEvent, cudaEventWaitExternal: "Event is captured in the graph as an
    // external event node when performing stream capture"; cudaGraphAddEventWaitNode: "The
    // graph node will wait for all work captured in event" (unverified: which record; simcuda
    // takes the most recent one as of each launch).
    if (flags & cudaEventWaitExternal) {
      cudaError_t err = cudaSuccess;
      graph_node* node = nullptr;
      capture_node(*s, "external event wait", &err, &node);
      if (node != nullptr) {
        node->type = graph_node::kind::wait_external;
        node->external = e;
      }
      return ret(err);
    }
    // driver_types.h, cudaErrorStreamCaptureIsolation: "A dependency would have been created
    // which crosses the capture sequence boundary. Only implicit in-stream ordering
    // dependencies are allowed to cross the boundary."
    s->capture->invalidated = true;
    return ret(cudaErrorStreamCaptureIsolation);
  }
  cudaError_t err = cudaSuccess;
  if (capture_node(*s, "event wait", &err)) return ret(err);
  // cudaStreamWaitEvent: "Makes all future work submitted to stream wait for all work captured
  // in event. [...] event may be from a different device than stream." An event never recorded
  // completes at once.
  auto o = std::make_unique<op>();
  o->what = "cudaStreamWaitEvent";
  if (e->recorded) {
    o->after.push_back(e->point);
    s->clock.join(e->clock);
  }
  enqueue(*s, std::move(o));
  return cudaSuccess;
}

}  // namespace
}  // namespace simcuda

using namespace simcuda;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
  SIMCUDA_ENTER("cudaStreamCreateWithFlags");
  if (out == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return ret(cudaErrorInvalidValue);
  const uintptr_t context = context_id();
  device_obj& d = context_device();
  stream_obj* s = make_stream(d, stream_obj::kind::created, (flags & cudaStreamNonBlocking) == 0);
  s->context = context;  // cuStreamGetCtx: "the context that was active in the calling thread"
  *out = reinterpret_cast<cudaStream_t>(s->handle);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* out) {
  return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t handle) {
  SIMCUDA_ENTER("cudaStreamDestroy");
  stream_obj* s = resolve_stream(handle, false, "cudaStreamDestroy");
  if (s == nullptr || s->type != stream_obj::kind::created) {
    return ret(cudaErrorInvalidResourceHandle);
  }
  if (s->capture != nullptr) unverified("cudaStreamDestroy of a capturing stream");
  s->destroyed = true;
  if (!s->worker_started) {
    device_obj& d = *r.devices[s->device];
    d.drained_clock.join(s->clock);
    d.streams.erase(std::remove(d.streams.begin(), d.streams.end(), s), d.streams.end());
  }
  r.cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return stream_synchronize(s, false);
}
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
  return stream_synchronize(s, true);
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  return stream_query(s, false);
}
cudaError_t cudaStreamQuery_ptsz(cudaStream_t s) {
  return stream_query(s, true);
}
cudaError_t cudaStreamGetId(cudaStream_t s, unsigned long long* id) {
  return stream_get_id(s, id, false);
}
cudaError_t cudaStreamGetId_ptsz(cudaStream_t s, unsigned long long* id) {
  return stream_get_id(s, id, true);
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* device) {
  return stream_get_device(s, device, false);
}
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t s, int* device) {
  return stream_get_device(s, device, true);
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  return stream_is_capturing(s, status, false);
}
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, cudaStreamCaptureStatus* status) {
  return stream_is_capturing(s, status, true);
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     size_t* count) {
  return stream_get_capture_info(s, status, id, graph, deps, edges, count, false);
}
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s, cudaStreamCaptureStatus* status,
                                          unsigned long long* id, cudaGraph_t* graph,
                                          const cudaGraphNode_t** deps,
                                          const cudaGraphEdgeData** edges, size_t* count) {
  return stream_get_capture_info(s, status, id, graph, deps, edges, count, true);
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  return stream_begin_capture(s, mode, false);
}
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, cudaStreamCaptureMode mode) {
  return stream_begin_capture(s, mode, true);
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  return stream_end_capture(s, graph, false);
}
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t* graph) {
  return stream_end_capture(s, graph, true);
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  return launch_host_func(s, fn, data, false);
}
cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn, void* data) {
  return launch_host_func(s, fn, data, true);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  SIMCUDA_ENTER("cudaThreadExchangeStreamCaptureMode");
  if (mode == nullptr) return ret(cudaErrorInvalidValue);
  std::swap(*mode, ts().mode);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
  SIMCUDA_ENTER("cudaEventCreateWithFlags");
  constexpr unsigned kKnown =
      cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (out == nullptr || (flags & ~kKnown) != 0) return ret(cudaErrorInvalidValue);
  const uintptr_t context = context_id();
  auto e = std::make_unique<event_obj>();
  e->handle = new_handle();
  e->context = context;
  e->flags = flags;
  if ((flags & cudaEventInterprocess) != 0) {
    if (cudaError_t err = ipc_event_init(*e); err != cudaSuccess) {
      if (e->shared_fd >= 0) close(e->shared_fd);
      return ret(err);
    }
  }
  *out = reinterpret_cast<cudaEvent_t>(e->handle);
  r.events.emplace(e->handle, std::move(e));
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* out) {
  return cudaEventCreateWithFlags(out, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  SIMCUDA_ENTER("cudaEventDestroy");
  event_obj* e = resolve_event(ev, "cudaEventDestroy");
  if (e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  // cudaEventDestroy: "In case event has been recorded but has not yet been completed when
  // cudaEventDestroy() is called, the function will return immediately and the resources
  // associated with event will be released automatically once the device has completed
  // event." Waits already enqueued hold the record's place, not the event.
  e->destroyed = true;
  if (e->shared != nullptr) ipc_event_destroyed(*e);
  if (e->shared_fd >= 0) close(e->shared_fd);  // other processes can no longer open it
  e->shared_fd = -1;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  return event_record(e, s, false);
}
cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  return event_record(e, s, true);
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  SIMCUDA_ENTER("cudaEventQuery");
  pause_point(lock, "cudaEventQuery");
  event_obj* e = resolve_event(ev, "cudaEventQuery");
  if (e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (e->opened) return ret(ipc_event_query(*e));
  // driver_types.h, cudaErrorCapturedEvent: "The operation is not permitted on an event which
  // was last recorded in a capturing stream."
  if (capture_obj* c = live_capture_of(*e)) return ret(refuse_captured_event(c));
  check_unsafe_unverified("cudaEventQuery");
  // cudaEventQuery: "If this work has successfully been completed by the device, or if
  // cudaEventRecord() has not been called on event, then cudaSuccess is returned. If this work
  // has not yet been completed by the device then cudaErrorNotReady is returned" (unverified:
  // whether not-ready also becomes the thread's last error; simcuda records it, so callers must
  // clear it).
  if (!e->recorded || e->captured_in != 0) return cudaSuccess;
  if (!done(e->point)) return ret(cudaErrorNotReady);
  r.host_clock.join(e->clock);
  ++r.host_clock_version;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  SIMCUDA_ENTER("cudaEventSynchronize");
  event_obj* e = resolve_event(ev, "cudaEventSynchronize");
  if (e == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (e->opened) {
    ipc_event_synchronize(lock, *e);
    return cudaSuccess;
  }
  if (capture_obj* c = live_capture_of(*e)) return ret(refuse_captured_event(c));
  check_unsafe_unverified("cudaEventSynchronize");
  if (!e->recorded || e->captured_in != 0) return cudaSuccess;
  const stream_point p = e->point;
  const vclock clock = e->clock;
  host_wait(lock, p, clock);
  apply_release_thresholds(*r.devices[p.stream->device]);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  return stream_wait_event(s, e, flags, false);
}
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  return stream_wait_event(s, e, flags, true);
}

cudaError_t cudaDeviceSynchronize(void) {
  SIMCUDA_ENTER("cudaDeviceSynchronize");
  device_obj& d = context_device();
  // Programming guide, "Prohibited and Unhandled Operations": "It is also invalid to query the
  // execution status of or synchronize a broader handle which encompasses an active stream
  // capture, such as a device or context handle when any associated stream is in capture
  // mode."
  bool capturing = false;
  for (stream_obj* t : d.streams) {
    if (t->capture != nullptr) {
      t->capture->invalidated = true;
      capturing = true;
    }
  }
  if (capturing) return ret(cudaErrorStreamCaptureUnsupported);
  check_unsafe_unverified("cudaDeviceSynchronize");
  device_wait(lock, d);
  apply_release_thresholds(d);
  return cudaSuccess;
}

}  // extern "C"
