/*
 * A test program for the CUDA fault shim: makes kernel launches through the stub CUDA
 * library (cuda_stub.c, linked as -lcuda) and prints one JSON line per launch, then one
 * with what reached the stub and what the error queries and syncs report.
 *
 *     cc -o cuda_driver cuda_driver.c -L. -lcuda
 *     LD_PRELOAD=cuda_fault_shim.so SPECCHAOS_CUDA_FAULT_NTH=3 ./cuda_driver n=5
 *
 * Arguments (key=value): n (launches, default 10); api (one launch entry point, default
 * every one in turn); arm_after (create $SPECCHAOS_CUDA_FAULT_ARM_FILE after that many
 * launches, then wait 2 ms); fork=1 (then fork: the child makes the same n launches, printing "proc": 1);
 * bench=N (instead: time N cuLaunchKernel calls and print {"ns_per_launch": ...}).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;

int cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
int cudaGraphLaunch(void *, void *);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                   void **);
int cuLaunchKernelEx(const void *, void *, void **, void **);
int cuGraphLaunch(void *, void *);
int cudaGetLastError(void);
int cudaPeekAtLastError(void);
int cudaDeviceSynchronize(void);
int cuCtxSynchronize(void);
int stub_launches(void);

static const char *APIS[] = {"cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuLaunchKernelEx",
                             "cuGraphLaunch"};

static int launch(const char *api) {
    dim3 one = {1, 1, 1};
    if (!strcmp(api, "cudaLaunchKernel")) return cudaLaunchKernel((void *)1, one, one, NULL, 0, NULL);
    if (!strcmp(api, "cuLaunchKernel")) return cuLaunchKernel((void *)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(api, "cudaGraphLaunch")) return cudaGraphLaunch((void *)1, NULL);
    if (!strcmp(api, "cuLaunchKernelEx")) return cuLaunchKernelEx(NULL, (void *)1, NULL, NULL);
    if (!strcmp(api, "cuGraphLaunch")) return cuGraphLaunch((void *)1, NULL);
    return -1;
}

static void run(int proc, int n, const char *api, int arm_after) {
    for (int k = 1; k <= n; k++) {
        if (arm_after >= 0 && k == arm_after + 1 && getenv("SPECCHAOS_CUDA_FAULT_ARM_FILE")) {
            int fd = open(getenv("SPECCHAOS_CUDA_FAULT_ARM_FILE"), O_WRONLY | O_CREAT, 0644);
            if (fd >= 0) close(fd);
            usleep(2000);   /* the shim looks for the file at most once a millisecond */
        }
        const char *a = api ? api : APIS[(k - 1) % 5];
        int rc = launch(a);
        int last = cudaGetLastError();
        printf("{\"proc\": %d, \"k\": %d, \"api\": \"%s\", \"rc\": %d, \"last\": %d}\n", proc, k, a, rc, last);
    }
    int peek = cudaPeekAtLastError();
    int sync = cudaDeviceSynchronize();
    int ctx = cuCtxSynchronize();
    printf("{\"proc\": %d, \"stub_launches\": %d, \"peek\": %d, \"sync\": %d, \"ctx_sync\": %d}\n", proc,
           stub_launches(), peek, sync, ctx);
    fflush(stdout);
}

static void bench(long n) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) cuLaunchKernel((void *)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("{\"ns_per_launch\": %.2f}\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
}

int main(int argc, char **argv) {
    int n = 10, arm_after = -1, do_fork = 0;
    const char *api = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "bench=", 6)) {
            bench(atol(argv[i] + 6));
            return 0;
        }
        if (!strncmp(argv[i], "n=", 2)) n = atoi(argv[i] + 2);
        else if (!strncmp(argv[i], "api=", 4)) api = argv[i] + 4;
        else if (!strncmp(argv[i], "arm_after=", 10)) arm_after = atoi(argv[i] + 10);
        else if (!strncmp(argv[i], "fork=", 5)) do_fork = atoi(argv[i] + 5);
    }
    run(0, n, api, arm_after);
    if (do_fork) {
        pid_t pid = fork();
        if (pid == 0) {
            run(1, n, api, -1);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
    }
    return 0;
}
