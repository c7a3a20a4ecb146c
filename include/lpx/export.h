/* lpx — export macros shared by every public header.
 * LPX_API marks a symbol exported from liblpx; everything else is hidden
 * (the library is built with -fvisibility=hidden). */
#ifndef LPX_EXPORT_H
#define LPX_EXPORT_H

#if defined(_WIN32)
#  define LPX_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#  define LPX_API __attribute__((visibility("default")))
#else
#  define LPX_API
#endif

#ifdef __cplusplus
#  define LPX_BEGIN_DECLS extern "C" {
#  define LPX_END_DECLS }
#else
#  define LPX_BEGIN_DECLS
#  define LPX_END_DECLS
#endif

#endif
