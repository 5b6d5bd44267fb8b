// Graphs: instantiation, launch (a replay of the captured nodes under the race checker, graph
// memory nodes included), destruction, and user objects. The rules come from the Runtime API
// reference (cudaGraphInstantiate, cudaGraphLaunch, cudaGraphAddMemAllocNode, the user-object
// calls) and the programming guide's "Graph Memory Nodes" and "CUDA User Objects".
#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

#include "state.hpp"

namespace simcuda {

bool graph_obj::has_memory_nodes() const {
  return std::any_of(nodes.begin(), nodes.end(), [](const graph_node& n) {
    return n.type == graph_node::kind::alloc || n.type == graph_node::kind::free;
  });
}

graph_obj* make_graph(int device) {
  auto g = std::make_unique<graph_obj>();
  g->handle = new_handle();
  g->device = device;
  graph_obj* raw = g.get();
  rt().graphs.emplace(raw->handle, std::move(g));
  return raw;
}

namespace {

/// Runs due user-object destructors, one at a time. cudaUserObjectCreate: "Destructor callbacks
/// cannot make CUDA API calls and should avoid blocking behavior, as they are executed by a
/// shared internal thread." The thread is flagged as inside a host function, so a CUDA call
/// from a destructor is a violation.
void destructor_thread() {
  runtime& r = rt();
  std::unique_lock<std::mutex> lock(r.mu);
  for (;;) {
    r.cv.wait(lock, [&] { return !r.destructors.empty(); });
    user_obj* u = r.destructors.front();
    r.destructors.pop_front();
    lock.unlock();
    ts().in_host_function = true;
    const auto start = std::chrono::steady_clock::now();
    u->destroy(u->ptr);
    const auto took = std::chrono::steady_clock::now() - start;
    ts().in_host_function = false;
    lock.lock();
    // simcuda_destructors_run: a test tells a destructor that blocked from the time it took.
    ++r.destructors_run;
    r.longest_destructor_us =
        std::max<uint64_t>(r.longest_destructor_us,
                           std::chrono::duration_cast<std::chrono::microseconds>(took).count());
  }
}

void release_refs(std::map<user_obj*, uint64_t>& refs) {
  for (auto& [u, count] : refs)
    release_user_object(*u, count);
  refs.clear();
}

template <typename T>
T* resolve(std::unordered_map<uintptr_t, std::unique_ptr<T>>& map, const void* handle,
           const char* what, const char* call) {
  auto it = map.find(reinterpret_cast<uintptr_t>(handle));
  if (it == map.end() || it->second->destroyed) {
    violation(format("%s: %p is not a live %s", call, handle, what));
    return nullptr;
  }
  return it->second.get();
}

/// A live graph, for `call`. "Graph objects (cudaGraph_t, CUgraph) are not internally
/// synchronized and must not be accessed concurrently from multiple threads. API calls accessing
/// the same graph object must be serialized externally" (Driver API, "Graph object thread
/// safety"). simcuda's lock makes every call atomic, so a call on a graph that another thread's
/// call has paused inside (pause_point) stands for the overlap that CUDA forbids.
graph_obj* resolve_graph(const void* handle, const char* call) {
  graph_obj* g = resolve(rt().graphs, handle, "graph", call);
  if (g != nullptr && g->inside != std::thread::id{} && g->inside != std::this_thread::get_id()) {
    violation(
        format("%s on graph %p while another thread is inside %s on it: graph objects are "
               "not internally synchronized, and calls on one must be serialized",
               call, handle, g->inside_call));
  }
  return g;
}

user_obj* resolve_user_object(cudaUserObject_t handle, const char* call) {
  auto it = rt().user_objects.find(reinterpret_cast<uintptr_t>(handle));
  // cudaUserObjectRelease: "It is undefined behavior [...] to use a user object handle after
  // all references are released."
  if (it == rt().user_objects.end() || it->second->refs == 0) {
    violation(format("%s: %p is not a live user object", call, static_cast<void*>(handle)));
    return nullptr;
  }
  return it->second.get();
}

/// "Must be nonzero and not larger than INT_MAX" (the reference counts of every user-object
/// call).
bool valid_count(unsigned count) {
  return count != 0 && count <= static_cast<unsigned>(INT_MAX);
}

/// The host has observed `x`'s last launch complete (with the lock).
void observe_last_launch(exec_obj& x) {
  if (x.last.stream == nullptr) return;
  rt().host_clock.join(x.last_clock);
  ++rt().host_clock_version;
}

void retire_lanes(exec_obj& x) {
  for (stream_obj* lane : x.lanes) {
    lane->destroyed = true;
    if (!lane->worker_started) {
      auto& list = rt().devices[lane->device]->streams;
      list.erase(std::remove(list.begin(), list.end(), lane), list.end());
    }
  }
  rt().cv.notify_all();
}

cudaError_t instantiate(cudaGraphExec_t* out, cudaGraph_t handle, unsigned long long flags,
                        const char* call) {
  SIMCUDA_ENTER(call);
  if (out == nullptr) return ret(cudaErrorInvalidValue);
  graph_obj* g = resolve_graph(handle, call);
  if (g == nullptr || !g->captured) return ret(cudaErrorInvalidValue);
  constexpr unsigned long long kKnown =
      cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
      cudaGraphInstantiateFlagDeviceLaunch | cudaGraphInstantiateFlagUseNodePriority;
  // cudaGraphInstantiateFlagDeviceLaunch: "This flag cannot be used in conjunction with
  // cudaGraphInstantiateFlagAutoFreeOnLaunch."
  const unsigned long long both =
      cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagDeviceLaunch;
  if ((flags & ~kKnown) != 0 || (flags & both) == both) return ret(cudaErrorInvalidValue);
  // cudaGraphInstantiate: "If graph contains any allocation or free nodes, there can be at most
  // one executable graph in existence for that graph at a time. An attempt to instantiate a
  // second executable graph before destroying the first with cudaGraphExecDestroy will result
  // in an error."
  const bool memory_nodes = g->has_memory_nodes();
  if (memory_nodes && g->exec != nullptr) return ret(cudaErrorInvalidValue);
  auto x = std::make_unique<exec_obj>();
  x->handle = new_handle();
  x->flags = flags;
  x->graph = g;
  x->nodes = g->nodes;
  device_obj& d = *r.devices[g->device];
  for (size_t i = 0; i < g->branches; ++i)
    x->lanes.push_back(make_stream(d, stream_obj::kind::graph_lane, /*blocking=*/false));
  // Programming guide, "CUDA User Objects": instantiation "will retain a new reference" of
  // each user object the graph owns.
  for (auto& [u, count] : g->user_refs) {
    u->refs += count;
    x->user_refs[u] += count;
  }
  if (memory_nodes) g->exec = x.get();
  *out = reinterpret_cast<cudaGraphExec_t>(x->handle);
  r.execs.emplace(x->handle, std::move(x));
  return cudaSuccess;
}

/// Enqueues node `n` of `x` on its lane after `deps` (and the launch's start); returns its seq.
uint64_t replay_node(exec_obj& x, const graph_node& n, std::unique_ptr<op> o) {
  runtime& r = rt();
  stream_obj& lane = *x.lanes[n.branch];
  o->what = n.what + " (graph replay)";
  switch (n.type) {
    case graph_node::kind::work: {
      o->run = n.run;
      o->host_function = n.host_function;
      const uint64_t seq = enqueue(lane, std::move(o));
      for (const node_access& t : n.touches)
        check_access(lane, seq, t.p, t.bytes, t.host_ok, t.what + " (graph replay)", t.write);
      return seq;
    }
    case graph_node::kind::wait_external:
      if (n.external->recorded && n.external->captured_in == 0) {
        o->after.push_back(n.external->point);
        lane.clock.join(n.external->clock);
      }
      return enqueue(lane, std::move(o));
    case graph_node::kind::alloc: {
      const uint64_t seq = enqueue(lane, std::move(o));
      auto a = std::make_unique<allocation>();
      a->base = n.address;
      a->bytes = n.memory->bytes;
      a->alloc = {&lane, seq};
      a->alloc_what = format("graph allocation node on %s", lane.name().c_str());
      a->graph_mem = n.memory;
      a->exec = &x;
      r.freed.erase(n.address);
      r.live[n.address] = std::move(a);
      x.unfreed.push_back(n.address);
      return seq;
    }
    case graph_node::kind::free:
      return graph_free(*r.live.at(n.address), lane, "graph free node", std::move(o));
  }
  return 0;
}

cudaError_t launch(cudaGraphExec_t handle, cudaStream_t stream, bool ptds) {
  SIMCUDA_ENTER("cudaGraphLaunch");
  exec_obj* x = resolve(r.execs, handle, "executable graph", "cudaGraphLaunch");
  if (x == nullptr) return ret(cudaErrorInvalidValue);
  stream_obj* s = resolve_stream(stream, ptds, "cudaGraphLaunch");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) {
    // A launch into a capture becomes a child graph node: not modeled.
    violation(format("cudaGraphLaunch on capturing %s: child graph nodes are not modeled",
                     s->name().c_str()));
    return ret(cudaErrorStreamCaptureUnsupported);
  }
  cudaError_t e = cudaSuccess;
  if (capture_node(*s, "cudaGraphLaunch", &e)) return ret(e);  // the legacy stream, blocked
  // cudaGraphLaunch: "If any allocations created by graphExec remain unfreed (from a previous
  // launch) and graphExec was not instantiated with cudaGraphInstantiateFlagAutoFreeOnLaunch,
  // the launch will fail with cudaErrorInvalidValue." AutoFreeOnLaunch "makes each launch
  // behave as though it called cudaMemFreeAsync for every unfreed allocation".
  if (!x->unfreed.empty()) {
    if ((x->flags & cudaGraphInstantiateFlagAutoFreeOnLaunch) == 0) {
      return ret(cudaErrorInvalidValue);
    }
    const std::vector<uintptr_t> unfreed = x->unfreed;
    for (uintptr_t base : unfreed)
      graph_free(*r.live.at(base), *s, "cudaGraphLaunch (free on launch)");
  }
  // "Each launch is ordered behind both any previous work in stream and any previous launches
  // of graphExec."
  auto start = std::make_unique<op>();
  start->what = "cudaGraphLaunch (start)";
  if (x->last.stream != nullptr) {
    start->after.push_back(x->last);
    s->clock.join(x->last_clock);
  }
  const stream_point begin{s, enqueue(*s, std::move(start))};
  const vclock begin_clock = s->clock;
  std::vector<stream_point> points(x->nodes.size());
  std::vector<vclock> clocks(x->nodes.size());
  for (size_t i = 0; i < x->nodes.size(); ++i) {
    const graph_node& n = x->nodes[i];
    stream_obj& lane = *x->lanes[n.branch];
    auto o = std::make_unique<op>();
    o->after.push_back(begin);
    lane.clock.join(begin_clock);
    for (size_t d : n.deps) {
      o->after.push_back(points[d]);
      lane.clock.join(clocks[d]);
    }
    points[i] = {&lane, replay_node(*x, n, std::move(o))};
    clocks[i] = lane.clock;
  }
  auto end = std::make_unique<op>();
  end->what = "cudaGraphLaunch (end)";
  for (size_t i = 0; i < points.size(); ++i) {
    end->after.push_back(points[i]);
    s->clock.join(clocks[i]);
  }
  x->last = {s, enqueue(*s, std::move(end))};
  x->last_clock = s->clock;
  return cudaSuccess;
}

}  // namespace

void release_user_object(user_obj& u, uint64_t count) {
  runtime& r = rt();
  u.refs -= std::min(count, u.refs);
  if (u.refs > 0) return;
  r.destructors.push_back(&u);
  if (!r.destructor_thread) {
    r.destructor_thread = true;
    std::thread(destructor_thread).detach();
  }
  r.cv.notify_all();
}

void drop_graph(graph_obj& g) {
  g.destroyed = true;
  release_refs(g.user_refs);
  g.nodes.clear();
  if (g.exec != nullptr) g.exec->graph = nullptr;
  g.exec = nullptr;
}

}  // namespace simcuda

using namespace simcuda;

extern "C" {

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* out, cudaGraph_t graph,
                                 unsigned long long flags) {
  return instantiate(out, graph, flags, "cudaGraphInstantiate");
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* out, cudaGraph_t graph,
                                          unsigned long long flags) {
  return instantiate(out, graph, flags, "cudaGraphInstantiateWithFlags");
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
  return launch(x, s, false);
}
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t x, cudaStream_t s) {
  return launch(x, s, true);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t handle) {
  SIMCUDA_ENTER("cudaGraphExecDestroy");
  exec_obj* x = resolve(r.execs, handle, "executable graph", "cudaGraphExecDestroy");
  if (x == nullptr) return ret(cudaErrorInvalidValue);
  x->destroyed = true;
  if (x->graph != nullptr && x->graph->exec == x) x->graph->exec = nullptr;
  // Programming guide, "CUDA User Objects": destroying an executable graph whose launch "is
  // not synchronized" defers the release of its references until the launch completed. A
  // destructor that runs then follows the launch's work, and so does whatever it sets off: to
  // the race checker, the host has observed the launch complete.
  if (x->last.stream != nullptr && !done(x->last)) {
    auto o = std::make_unique<op>();
    o->what = "cudaGraphExecDestroy (release of user objects)";
    o->after.push_back(x->last);
    o->complete = [x] {
      observe_last_launch(*x);
      release_refs(x->user_refs);
    };
    enqueue(*x->lanes.front(), std::move(o));
  } else {
    observe_last_launch(*x);
    release_refs(x->user_refs);
  }
  x->nodes.clear();
  retire_lanes(*x);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t handle) {
  SIMCUDA_ENTER("cudaGraphDestroy");
  graph_obj* g = resolve_graph(handle, "cudaGraphDestroy");
  if (g == nullptr) return ret(cudaErrorInvalidValue);
  // cudaStreamGetCaptureInfo, graph_out: "All operations other than destroy and node removal
  // are permitted on the graph while the capture sequence is in progress."
  if (!g->captured) {
    violation(format("cudaGraphDestroy(%p): the graph is still being captured",
                     static_cast<void*>(handle)));
    return ret(cudaErrorInvalidValue);
  }
  drop_graph(*g);
  return cudaSuccess;
}

cudaError_t cudaUserObjectCreate(cudaUserObject_t* out, void* ptr, cudaHostFn_t destroy,
                                 unsigned int initial_refcount, unsigned int flags) {
  SIMCUDA_ENTER("cudaUserObjectCreate");
  // flags: "Currently it is required to pass cudaUserObjectNoDestructorSync".
  if (out == nullptr || destroy == nullptr || !valid_count(initial_refcount) ||
      flags != cudaUserObjectNoDestructorSync) {
    return ret(cudaErrorInvalidValue);
  }
  auto u = std::make_unique<user_obj>();
  u->handle = new_handle();
  u->ptr = ptr;
  u->destroy = destroy;
  u->refs = initial_refcount;
  *out = reinterpret_cast<cudaUserObject_t>(u->handle);
  r.user_objects.emplace(u->handle, std::move(u));
  return cudaSuccess;
}

cudaError_t cudaUserObjectRetain(cudaUserObject_t object, unsigned int count) {
  SIMCUDA_ENTER("cudaUserObjectRetain");
  user_obj* u = resolve_user_object(object, "cudaUserObjectRetain");
  if (u == nullptr || !valid_count(count)) return ret(cudaErrorInvalidValue);
  u->refs += count;
  return cudaSuccess;
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  SIMCUDA_ENTER("cudaUserObjectRelease");
  user_obj* u = resolve_user_object(object, "cudaUserObjectRelease");
  if (u == nullptr || !valid_count(count)) return ret(cudaErrorInvalidValue);
  if (count > u->refs) {
    violation(format("cudaUserObjectRelease(%p, %u): releases more references than exist",
                     static_cast<void*>(object), count));
    return ret(cudaErrorInvalidValue);
  }
  release_user_object(*u, count);
  return cudaSuccess;
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                      unsigned int count, unsigned int flags) {
  SIMCUDA_ENTER("cudaGraphRetainUserObject");
  graph_obj* g = resolve_graph(graph, "cudaGraphRetainUserObject");
  user_obj* u = resolve_user_object(object, "cudaGraphRetainUserObject");
  if (g == nullptr || u == nullptr || !valid_count(count) ||
      (flags & ~unsigned{cudaGraphUserObjectMove}) != 0) {
    return ret(cudaErrorInvalidValue);
  }
  // "The optional flag cudaGraphUserObjectMove transfers references from the calling thread,
  // rather than create new references."
  if ((flags & cudaGraphUserObjectMove) == 0) u->refs += count;
  g->user_refs[u] += count;
  // Inside the call on the graph across the pause (simcuda_delay_calls), as a real call is for
  // its whole length.
  g->inside = std::this_thread::get_id();
  g->inside_call = "cudaGraphRetainUserObject";
  pause_point(lock, "cudaGraphRetainUserObject");
  g->inside = std::thread::id{};
  return cudaSuccess;
}

cudaError_t cudaGraphReleaseUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                       unsigned int count) {
  SIMCUDA_ENTER("cudaGraphReleaseUserObject");
  graph_obj* g = resolve_graph(graph, "cudaGraphReleaseUserObject");
  user_obj* u = resolve_user_object(object, "cudaGraphReleaseUserObject");
  if (g == nullptr || u == nullptr || !valid_count(count)) return ret(cudaErrorInvalidValue);
  auto it = g->user_refs.find(u);
  if (it == g->user_refs.end() || it->second < count) {
    violation(format("cudaGraphReleaseUserObject: the graph owns fewer than %u references", count));
    return ret(cudaErrorInvalidValue);
  }
  it->second -= count;
  if (it->second == 0) g->user_refs.erase(it);
  release_user_object(*u, count);
  return cudaSuccess;
}

cudaError_t cudaDeviceGraphMemTrim(int device) {
  SIMCUDA_ENTER("cudaDeviceGraphMemTrim");
  // simcuda gives graph memory back as soon as nothing holds it, so there is nothing to trim.
  return device_at(device) != nullptr ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

}  // extern "C"
