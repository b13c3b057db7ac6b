// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), as
// macros that expand to nothing on other compilers.
//
// The rule in nopfs: every member a mutex protects is declared GUARDED_BY(that mutex) (or
// PT_GUARDED_BY for what a guarded pointer points to), every function that expects the caller to
// hold a mutex (the *Locked functions) is declared REQUIRES(it), and the mutex is a nopfs::Mutex
// (common/mutex.h), so that clang checks each access: scripts/thread_safety.py compiles every
// translation unit with -Wthread-safety -Werror=thread-safety, and scripts/test.sh runs it.
#pragma once

#if defined(__clang__)
#define NOPFS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define NOPFS_THREAD_ANNOTATION(x)
#endif

// A class that is a lock (Mutex) or holds one for a scope (MutexLock).
#define CAPABILITY(name) NOPFS_THREAD_ANNOTATION(capability(name))
#define SCOPED_CAPABILITY NOPFS_THREAD_ANNOTATION(scoped_lockable)

// Data: read and written only with the mutex held.
#define GUARDED_BY(mu) NOPFS_THREAD_ANNOTATION(guarded_by(mu))
// The data a pointer member points to is read and written only with the mutex held.
#define PT_GUARDED_BY(mu) NOPFS_THREAD_ANNOTATION(pt_guarded_by(mu))
// Lock order: this mutex is taken after / before the named ones.
#define ACQUIRED_AFTER(...) NOPFS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) NOPFS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))

// Functions: the caller holds (REQUIRES) or does not hold (EXCLUDES) the mutex.
#define REQUIRES(...) NOPFS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// ... or holds it at least shared (a reader's lock of a SharedMutex).
#define REQUIRES_SHARED(...) NOPFS_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define EXCLUDES(...) NOPFS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes (ACQUIRE) or lets go of (RELEASE) the mutex.
#define ACQUIRE(...) NOPFS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) NOPFS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// The same for a shared (reader's) hold of a SharedMutex.
#define ACQUIRE_SHARED(...) NOPFS_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) NOPFS_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) NOPFS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The function checks at run time that the mutex is held (and tells the analysis so).
#define ASSERT_CAPABILITY(x) NOPFS_THREAD_ANNOTATION(assert_capability(x))
// The function returns a reference to the named mutex.
#define RETURN_CAPABILITY(x) NOPFS_THREAD_ANNOTATION(lock_returned(x))
// Turns the analysis off for one function; say in a comment why it is safe.
#define NO_THREAD_SAFETY_ANALYSIS NOPFS_THREAD_ANNOTATION(no_thread_safety_analysis)
