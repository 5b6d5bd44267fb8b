// Exit safety: no CUDA call once the process has started tearing the CUDA runtime down.
#pragma once

#include <functional>

namespace arcpool::detail {

/// True once the process is exiting (our atexit hook ran, or CUDA said it is unloading).
/// Free paths then skip every CUDA call: the process is about to give all memory back.
bool process_exiting() noexcept;

/// Marks the process as exiting (called when CUDA reports cudaErrorCudartUnloading).
void mark_process_exiting() noexcept;

/// Registers, once, the atexit hook that marks the process as exiting and runs the exit
/// listeners. Call it right after the CUDA runtime initialized: atexit hooks run in reverse
/// order, so ours then runs before the runtime's own teardown.
void arm_exit_hook() noexcept;

/// A callback run by the exit hook (reclaim workers stop there), in the order they were added,
/// each after the previous returned. Returns a token for remove_exit_listener.
int add_exit_listener(std::function<void()> listener);

/// Removes a listener; it will not run (also when removed by an earlier listener at exit). If
/// the exit hook is running it on another thread, waits for it to return: its owner may go once
/// this returns. A listener may remove itself.
void remove_exit_listener(int token) noexcept;

}  // namespace arcpool::detail
