/* arcpool: symbol visibility for the public C and C++ APIs. */
#ifndef ARCPOOL_EXPORT_H_
#define ARCPOOL_EXPORT_H_

/* ARCPOOL_API marks a symbol exported from the shared library. Everything else is hidden
 * (the library is built with -fvisibility=hidden). Static builds define ARCPOOL_STATIC. */
#if defined(ARCPOOL_STATIC)
#define ARCPOOL_API
#elif defined(ARCPOOL_BUILDING_LIBRARY)
#define ARCPOOL_API __attribute__((visibility("default")))
#else
#define ARCPOOL_API
#endif

#endif /* ARCPOOL_EXPORT_H_ */
