/*
 * A stand-in for the CUDA libraries (libcuda and libcudart) for testing the CUDA fault
 * shim (faults/native/cuda_fault_shim.c) without a GPU: every entry point the shim
 * intercepts, each returning success (0) and counting the calls that reached it.
 *
 *     cc -shared -fPIC -o libcuda.so cuda_stub.c
 *
 * stub_launches() is how many launches got through to "CUDA"; stub_calls(name) how many
 * calls of one entry point did.
 */
#include <stddef.h>
#include <string.h>

typedef struct { unsigned x, y, z; } dim3;

static int launches, n_get_last, n_peek, n_dev_sync, n_stream_sync, n_ctx_sync, n_cu_stream_sync;

int stub_launches(void) { return launches; }

int stub_calls(const char *name) {
    if (strcmp(name, "cudaGetLastError") == 0) return n_get_last;
    if (strcmp(name, "cudaPeekAtLastError") == 0) return n_peek;
    if (strcmp(name, "cudaDeviceSynchronize") == 0) return n_dev_sync;
    if (strcmp(name, "cudaStreamSynchronize") == 0) return n_stream_sync;
    if (strcmp(name, "cuCtxSynchronize") == 0) return n_ctx_sync;
    if (strcmp(name, "cuStreamSynchronize") == 0) return n_cu_stream_sync;
    return -1;
}

int cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t s, void *st) { launches++; return 0; }
int cudaGraphLaunch(void *e, void *st) { launches++; return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned sh, void *st, void **p, void **x) { launches++; return 0; }
int cuLaunchKernelEx(const void *c, void *f, void **p, void **x) { launches++; return 0; }
int cuGraphLaunch(void *e, void *st) { launches++; return 0; }
int cudaGetLastError(void) { n_get_last++; return 0; }
int cudaPeekAtLastError(void) { n_peek++; return 0; }
int cudaDeviceSynchronize(void) { n_dev_sync++; return 0; }
int cudaStreamSynchronize(void *st) { n_stream_sync++; return 0; }
int cuCtxSynchronize(void) { n_ctx_sync++; return 0; }
int cuStreamSynchronize(void *st) { n_cu_stream_sync++; return 0; }
