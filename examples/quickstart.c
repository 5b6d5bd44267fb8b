/* The C quick-start example of README.md (kept identical by the readme_examples test). */
#include <arcpool/arcpool.h>
#include <stdio.h>

#define CHECK(call)                                                    \
  do {                                                                 \
    if ((call) != ARCPOOL_STATUS_SUCCESS) {                            \
      fprintf(stderr, "%s failed: %s\n", #call, arcpool_last_error()); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

int main(void) {
  arcpool_allocator_t* alloc = NULL;
  CHECK(arcpool_allocator_create(NULL, &alloc)); /* device 0; CUDA if usable, else host */

  arcpool_stream_t producer = NULL, consumer = NULL;
  CHECK(arcpool_stream_create(alloc, &producer));
  CHECK(arcpool_stream_create(alloc, &consumer));

  /* One owner, one reference; the producer stream is the origin. */
  arcpool_allocation_t* buf = NULL;
  CHECK(arcpool_allocate_async(alloc, 1 << 20, 0, producer, 0, &buf));
  /* ... enqueue the producer's writes on `producer` ... */

  /* Hand it over with a fence: work queued on `consumer` now waits for the producer. */
  CHECK(arcpool_transfer(buf, consumer));
  /* ... enqueue the consumer's reads on `consumer` ... */

  /* Free after the consumer's work; the memory goes back to the producer's lane. */
  CHECK(arcpool_deallocate_async(buf, consumer, 0));
  CHECK(arcpool_allocation_release(buf)); /* the handle's reference */

  CHECK(arcpool_stream_synchronize(alloc, consumer));
  CHECK(arcpool_stream_destroy(alloc, producer));
  CHECK(arcpool_stream_destroy(alloc, consumer));
  printf("ok: %s driver\n", arcpool_driver_name(arcpool_allocator_driver(alloc)));
  arcpool_allocator_destroy(alloc);
  return 0;
}
