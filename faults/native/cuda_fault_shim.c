/*
 * specchaos CUDA fault shim: an LD_PRELOAD library that makes chosen CUDA kernel launches
 * fail with a chosen error, for the `cuda-error` fault family (faults/cuda_error.py).
 *
 * Build (the harness does this itself, see faults/cuda_error.py: build_shim):
 *     cc -shared -fPIC -O2 -o cuda_fault_shim.so cuda_fault_shim.c -ldl
 * It needs no CUDA header: the few types it forwards are declared here, by their ABI.
 *
 * Intercepted (resolved through the dynamic linker, so LD_PRELOAD comes first):
 *   launches  cudaLaunchKernel, cudaGraphLaunch (runtime, libcudart);
 *             cuLaunchKernel, cuLaunchKernelEx, cuGraphLaunch (driver, libcuda)
 *   queries   cudaGetLastError, cudaPeekAtLastError
 *   syncs     cudaDeviceSynchronize, cudaStreamSynchronize, cuCtxSynchronize, cuStreamSynchronize
 * A launch that fails is not passed on to CUDA. Calls the process makes through function
 * pointers it fetched itself (cuGetProcAddress, dlsym on a library handle) are not seen.
 *
 * Configuration (environment, read once per process):
 *   SPECCHAOS_CUDA_FAULT_ERROR     the error returned, a CUDA error code (default 700,
 *                                  illegal address; 719 launch failure). Runtime and driver
 *                                  share these numbers.
 *   SPECCHAOS_CUDA_FAULT_NTH       fail the Nth counted launch (1-based), or
 *   SPECCHAOS_CUDA_FAULT_FRACTION  fail each counted launch with this probability, drawn
 *   SPECCHAOS_CUDA_FAULT_SEED      from a seeded generator: launch k fails when
 *                                  splitmix64(seed + k * 0x9E3779B97F4A7C15) / 2^64 < fraction
 *                                  (the same seed fails the same launches).
 *   SPECCHAOS_CUDA_FAULT_STICKY    1 (default): after the first injected error, every later
 *                                  launch, sync and error query of the process returns it, as
 *                                  a real illegal address or launch failure leaves the CUDA
 *                                  context unusable. 0: only the chosen launches fail, and
 *                                  cudaGetLastError reports (and resets) the last one.
 *   SPECCHAOS_CUDA_FAULT_TITLES    comma-separated prefixes of the process title
 *                                  (/proc/self/cmdline's first string, which setproctitle
 *                                  sets, e.g. VLLM::Worker); empty or unset: every process.
 *   SPECCHAOS_CUDA_FAULT_ARM_FILE  launches are counted only while this file exists (unset:
 *                                  always); looked up with access(2) at most once a
 *                                  millisecond (CLOCK_MONOTONIC, from the vDSO), at a launch.
 *   SPECCHAOS_CUDA_FAULT_LOG       a file to append one JSON line to per event:
 *                                  {"event": "armed"|"error", "t": epoch s, "pid", "title",
 *                                   "api", "launch": k, "error": code}; "armed" once per
 *                                  process at its first counted launch, "error" per
 *                                  injected error (at most SPECCHAOS_CUDA_FAULT_LOG_MAX per
 *                                  process, default 100).
 *
 * State is per process: the counter, the title match and the sticky error start afresh
 * in a forked child (pthread_atfork), so the Nth launch is the Nth of each matching process.
 * Cost per launch, measured against the stub on a loaded 2-core host (bench/gpu_costs.py):
 * about 4 ns for the call alone, 19-31 ns through the shim, 39-60 ns with an arm file (a
 * clock read, and an access(2) once a millisecond), against the microseconds a real kernel
 * launch takes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int cuda_status;                 /* cudaError_t and CUresult: an enum, int-sized */
typedef struct { unsigned x, y, z; } dim3;
typedef void *handle;                    /* CUfunction, CUstream, cudaStream_t, graph execs */

#define ENV(name) getenv("SPECCHAOS_CUDA_FAULT_" name)
#define GAMMA 0x9E3779B97F4A7C15ULL

static struct {
    pthread_mutex_t lock;
    pid_t pid;               /* the process this state belongs to */
    int configured;
    int error;
    unsigned long long nth;  /* 0: fraction mode */
    double fraction;
    unsigned long long seed;
    int sticky;
    char titles[512];
    char arm_file[4096];
    char log_file[4096];
    int log_max;
    int matched;             /* -1 unknown, 0 no, 1 yes */
    char title[128];
    unsigned long long launches;   /* counted launches */
    int armed_logged;
    int logged;
    int sticky_error;        /* 0: none */
    int pending_error;       /* non-sticky: what cudaGetLastError reports next */
    int armed;               /* the arm file existed at the last look */
    long long next_arm_check_ns;
} S = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* A fork while another thread holds the lock would leave the child's copy locked: hold it
 * across fork, and release it on both sides; the child starts its own state. */
static void before_fork(void) { pthread_mutex_lock(&S.lock); }
static void parent_after_fork(void) { pthread_mutex_unlock(&S.lock); }
static void child_after_fork(void) {
    S.configured = 0;
    pthread_mutex_unlock(&S.lock);
}

__attribute__((constructor)) static void shim_init(void) {
    pthread_atfork(before_fork, parent_after_fork, child_after_fork);
}

static unsigned long long splitmix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void read_title(void) {
    S.title[0] = '\0';
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, S.title, sizeof S.title - 1);
    close(fd);
    S.title[n > 0 ? n : 0] = '\0';  /* the first string ends at its NUL */
    for (char *p = S.title; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '?';   /* safe in JSON */
}

static int title_matches(void) {
    if (!S.titles[0]) return 1;
    char list[sizeof S.titles];
    memcpy(list, S.titles, sizeof list);
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (*tok && strncmp(S.title, tok, strlen(tok)) == 0) return 1;
    return 0;
}

/* Caller holds the lock. Reads the configuration once per process (a forked child again). */
static void ensure_state(void) {
    if (S.configured) return;
    S.pid = getpid();
    S.configured = 1;
    const char *v;
    S.error = (v = ENV("ERROR")) && *v ? atoi(v) : 700;
    S.nth = (v = ENV("NTH")) && *v ? strtoull(v, NULL, 10) : 0;
    S.fraction = (v = ENV("FRACTION")) && *v ? strtod(v, NULL) : 0.0;
    S.seed = (v = ENV("SEED")) && *v ? strtoull(v, NULL, 10) : 0;
    S.sticky = (v = ENV("STICKY")) && *v ? atoi(v) != 0 : 1;
    S.log_max = (v = ENV("LOG_MAX")) && *v ? atoi(v) : 100;
    snprintf(S.titles, sizeof S.titles, "%s", (v = ENV("TITLES")) ? v : "");
    snprintf(S.arm_file, sizeof S.arm_file, "%s", (v = ENV("ARM_FILE")) ? v : "");
    snprintf(S.log_file, sizeof S.log_file, "%s", (v = ENV("LOG")) ? v : "");
    S.matched = -1;
    S.launches = 0;
    S.armed_logged = 0;
    S.logged = 0;
    S.sticky_error = 0;
    S.pending_error = 0;
    S.armed = S.arm_file[0] ? 0 : 1;
    S.next_arm_check_ns = 0;
}

static long long monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Whether launches count now: the arm file exists (looked up at most once per millisecond). */
static int armed(void) {
    if (!S.arm_file[0]) return 1;
    long long t = monotonic_ns();
    if (t >= S.next_arm_check_ns) {
        S.armed = access(S.arm_file, F_OK) == 0;
        S.next_arm_check_ns = t + 1000000LL;
    }
    return S.armed;
}

static void log_event(const char *event, const char *api, unsigned long long launch, int error) {
    if (!S.log_file[0]) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[512];
    int n = snprintf(line, sizeof line,
                     "{\"event\": \"%s\", \"t\": %lld.%06ld, \"pid\": %d, \"title\": \"%s\", \"api\": \"%s\", "
                     "\"launch\": %llu, \"error\": %d}\n",
                     event, (long long)ts.tv_sec, ts.tv_nsec / 1000, (int)S.pid, S.title, api, launch, error);
    int fd = open(S.log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (n > 0) {
        ssize_t w = write(fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
        (void)w;
    }
    close(fd);
}

/* 0: let the launch through; else the error to return instead of launching. */
static int decide(const char *api) {
    int out = 0;
    int saved = errno;
    pthread_mutex_lock(&S.lock);
    ensure_state();
    if (S.sticky_error) {
        out = S.sticky_error;
        goto done;
    }
    if (S.matched < 0) {
        read_title();
        S.matched = title_matches();
    }
    if (!S.matched || (S.nth == 0 && S.fraction <= 0.0)) goto done;
    if (!armed()) goto done;
    unsigned long long k = ++S.launches;
    if (!S.armed_logged) {
        S.armed_logged = 1;
        log_event("armed", api, k, 0);
    }
    int fail = S.nth ? (k == S.nth)
                     : ((double)splitmix64(S.seed + k * GAMMA) / 18446744073709551616.0 < S.fraction);
    if (fail) {
        out = S.error;
        if (S.sticky) S.sticky_error = S.error;
        else S.pending_error = S.error;
        if (S.logged < S.log_max) {
            S.logged++;
            log_event("error", api, k, S.error);
        }
    }
done:
    pthread_mutex_unlock(&S.lock);
    errno = saved;
    return out;
}

/* The error a query or sync reports instead of CUDA's: the sticky one (or, for
 * cudaGetLastError/cudaPeekAtLastError, the pending one); 0: ask CUDA. */
static int reported(int consume) {
    int out = 0;
    pthread_mutex_lock(&S.lock);
    ensure_state();
    if (S.sticky_error) out = S.sticky_error;
    else if (consume >= 0 && S.pending_error) {
        out = S.pending_error;
        if (consume) S.pending_error = 0;
    }
    pthread_mutex_unlock(&S.lock);
    return out;
}

static void *next(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "specchaos cuda fault shim: %s not found after the shim (is CUDA loaded?)\n", name);
    }
    return f;
}

#define REAL(type, name) \
    static type real_##name; \
    if (!real_##name) real_##name = (type)next(#name); \
    if (!real_##name) return 999 /* cudaErrorUnknown / CUDA_ERROR_UNKNOWN */

/* ---------------------------------------------------------------- launches */
cuda_status cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, handle stream) {
    typedef cuda_status (*fn_t)(const void *, dim3, dim3, void **, size_t, handle);
    int e = decide("cudaLaunchKernel");
    if (e) return e;
    REAL(fn_t, cudaLaunchKernel);
    return real_cudaLaunchKernel(func, grid, block, args, shmem, stream);
}

cuda_status cudaGraphLaunch(handle exec, handle stream) {
    typedef cuda_status (*fn_t)(handle, handle);
    int e = decide("cudaGraphLaunch");
    if (e) return e;
    REAL(fn_t, cudaGraphLaunch);
    return real_cudaGraphLaunch(exec, stream);
}

cuda_status cuLaunchKernel(handle f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                           unsigned shmem, handle stream, void **params, void **extra) {
    typedef cuda_status (*fn_t)(handle, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, handle,
                                void **, void **);
    int e = decide("cuLaunchKernel");
    if (e) return e;
    REAL(fn_t, cuLaunchKernel);
    return real_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

cuda_status cuLaunchKernelEx(const void *config, handle f, void **params, void **extra) {
    typedef cuda_status (*fn_t)(const void *, handle, void **, void **);
    int e = decide("cuLaunchKernelEx");
    if (e) return e;
    REAL(fn_t, cuLaunchKernelEx);
    return real_cuLaunchKernelEx(config, f, params, extra);
}

cuda_status cuGraphLaunch(handle exec, handle stream) {
    typedef cuda_status (*fn_t)(handle, handle);
    int e = decide("cuGraphLaunch");
    if (e) return e;
    REAL(fn_t, cuGraphLaunch);
    return real_cuGraphLaunch(exec, stream);
}

/* ---------------------------------------------------------------- error queries */
cuda_status cudaGetLastError(void) {
    typedef cuda_status (*fn_t)(void);
    int e = reported(1);
    if (e) return e;
    REAL(fn_t, cudaGetLastError);
    return real_cudaGetLastError();
}

cuda_status cudaPeekAtLastError(void) {
    typedef cuda_status (*fn_t)(void);
    int e = reported(0);
    if (e) return e;
    REAL(fn_t, cudaPeekAtLastError);
    return real_cudaPeekAtLastError();
}

/* ---------------------------------------------------------------- syncs (a sticky error only) */
cuda_status cudaDeviceSynchronize(void) {
    typedef cuda_status (*fn_t)(void);
    int e = reported(-1);
    if (e) return e;
    REAL(fn_t, cudaDeviceSynchronize);
    return real_cudaDeviceSynchronize();
}

cuda_status cudaStreamSynchronize(handle stream) {
    typedef cuda_status (*fn_t)(handle);
    int e = reported(-1);
    if (e) return e;
    REAL(fn_t, cudaStreamSynchronize);
    return real_cudaStreamSynchronize(stream);
}

cuda_status cuCtxSynchronize(void) {
    typedef cuda_status (*fn_t)(void);
    int e = reported(-1);
    if (e) return e;
    REAL(fn_t, cuCtxSynchronize);
    return real_cuCtxSynchronize();
}

cuda_status cuStreamSynchronize(handle stream) {
    typedef cuda_status (*fn_t)(handle);
    int e = reported(-1);
    if (e) return e;
    REAL(fn_t, cuStreamSynchronize);
    return real_cuStreamSynchronize(stream);
}
