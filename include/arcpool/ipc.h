/* arcpool: pool memory shared with another process (design.md §14). The CUDA driver only; the
 * host and null drivers answer ARCPOOL_STATUS_UNSUPPORTED. */
#ifndef ARCPOOL_IPC_H_
#define ARCPOOL_IPC_H_

#include <stddef.h>

#include "arcpool/arcpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The exporting end of one connection: shares an allocator's owned pool with the process at
 * the other end of a Unix socket, and holds a claim on each allocation it sent until that
 * process released its import (or exited). */
typedef struct arcpool_ipc_exporter arcpool_ipc_exporter_t;

/** The importing end of one connection: the other process's pool, imported, and the
 * allocations it sends, wrapped as EXTERNAL allocations of a local allocator. */
typedef struct arcpool_ipc_importer arcpool_ipc_importer_t;

/**
 * Starts sharing `allocator`'s pool over `socket_fd`, a connected AF_UNIX SOCK_STREAM socket in
 * blocking mode (INVALID_ARGUMENT for any other descriptor, O_NONBLOCK set included; it must stay
 * blocking) whose other end calls arcpool_ipc_importer_create. The pool must be owned and created
 * with ipc_handle_types including cudaMemHandleTypePosixFileDescriptor (INVALID_ARGUMENT otherwise:
 * a device's default pool cannot be exported). Sends the pool's file descriptor (SCM_RIGHTS), reads
 * the importer's greeting (blocking until it arrives) and starts a thread that watches the socket.
 * The importing process, whose exit ends its claims, is the one the kernel names for the greeting
 * (SCM_CREDENTIALS); UNSUPPORTED when it names none (the importer runs in a PID namespace this
 * process cannot see). On success the exporter owns `socket_fd`; on failure the caller still does.
 */
ARCPOOL_API arcpool_status_t arcpool_ipc_exporter_create(arcpool_allocator_t* allocator,
                                                         int socket_fd,
                                                         arcpool_ipc_exporter_t** out_exporter);

/**
 * Sends `allocation` (of the exporter's allocator, with alignment at most 256) to the importer:
 * records an interprocess event after the work queued so far on every stream the allocation
 * may be used on (on its current stream; with use records, on the exporter's own stream once
 * it waited on a fence of each), and sends the pointer's export data with the event. The
 * exporter takes a claim and a reference, dropped once the importer's free of its import has
 * completed (the drop is ordered after the importer's interprocess event), or once the
 * importer's process has exited. Never blocks on the device; the socket write may block while
 * the importer does not read. UNSUPPORTED, with nothing sent, while a stream to fence captures
 * a graph (the event would be a node of the graph), and when the current stream was destroyed
 * or unregistered or is another thread's per-thread default stream (no fence taken here
 * covers its work: transfer the allocation first, as for arcpool_allocation_export).
 * UNSUPPORTED too, with nothing sent, for an allocation already sent over this connection that
 * the importer has not released (it cannot import one allocation twice).
 */
ARCPOOL_API arcpool_status_t arcpool_ipc_send(arcpool_ipc_exporter_t* exporter,
                                              arcpool_allocation_t* allocation);

/** `*out_count`: allocations sent whose importer has neither released them nor exited. */
ARCPOOL_API arcpool_status_t
arcpool_ipc_exporter_outstanding(const arcpool_ipc_exporter_t* exporter, size_t* out_count);

/**
 * Sends nothing more (the importer's next receive gets PEER_GONE). Claims still held are
 * dropped as the importer releases them or exits; the watching thread ends then. Never blocks.
 */
ARCPOOL_API void arcpool_ipc_exporter_destroy(arcpool_ipc_exporter_t* exporter);

/**
 * Joins the connection an exporter shares over `socket_fd` (an AF_UNIX SOCK_STREAM socket in
 * blocking mode, as for arcpool_ipc_exporter_create): sends a greeting naming this
 * process, receives the pool's file descriptor (blocking until it arrives) and imports the
 * pool for `allocator`'s device: a pool resident on another GPU gets that device's read-write
 * access (cudaMemPoolSetAccess; UNSUPPORTED when the device cannot reach that GPU). An imported
 * pool cannot allocate. On success the importer owns `socket_fd`; on failure the caller still
 * does.
 */
ARCPOOL_API arcpool_status_t arcpool_ipc_importer_create(arcpool_allocator_t* allocator,
                                                         int socket_fd,
                                                         arcpool_ipc_importer_t** out_importer);

/**
 * Receives the next allocation the exporter sent (blocking until one arrives), imports it,
 * makes `stream` wait on the exporter's interprocess event, and returns it as an EXTERNAL
 * allocation of the importer's allocator with origin and current stream `stream`, one claim
 * and one reference. When its last owner deallocates it and its fences completed, arcpool
 * frees the import (cudaFreeAsync), records an interprocess event after that free and tells
 * the exporter, whose free waits on that event. PEER_GONE once the exporter exited or
 * destroyed its side; imports already received stay usable and are freed as usual.
 * UNSUPPORTED while `stream` captures a graph, also one begun while this call waited (the wait
 * on the exporter's event would cross the capture's boundary): the allocation stays queued
 * for the next receive, and the capture intact. Thread-safe: receives on several threads take
 * turns. INVALID_ARGUMENT when arcpool_ipc_importer_destroy ran on another thread while this
 * call waited, once the next message arrives or the exporter goes (a destroy does not wake it).
 */
ARCPOOL_API arcpool_status_t arcpool_ipc_receive(arcpool_ipc_importer_t* importer,
                                                 arcpool_stream_t stream,
                                                 arcpool_allocation_t** out_allocation);

/**
 * Drops the caller's handle. The connection closes, and the imported pool goes, once every
 * allocation received is freed. The allocations sent and not received, those queued now and
 * those that arrive before the connection closes, are refused to the exporter, whose claims on
 * them go while this process lives (a refusal that cannot be written at once, the socket being
 * full or another thread sending, leaves that claim until this process exits). Never blocks.
 * May be called while another thread's arcpool_ipc_receive waits (see there), not while one
 * is being called, nor twice.
 */
ARCPOOL_API void arcpool_ipc_importer_destroy(arcpool_ipc_importer_t* importer);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ARCPOOL_IPC_H_ */
