/* A stand-in for libcuda, for tests on machines without a GPU: the device queries answer for
 * one "Fake GPU", and the checkpoint API runs the real state machine (running → locked →
 * checkpointed → locked → running) per target pid, kept in STATE_DIR/<pid>.state, appending
 * each successful call's name to STATE_DIR/<pid>.calls ("lock <timeout_ms>" for the lock).
 * Non-zero reserved argument bytes give CUDA_ERROR_INVALID_VALUE. A call named on a line of
 * STATE_DIR/<pid>.fail fails instead (lock with CUDA_ERROR_NOT_READY, the others with
 * CUDA_ERROR_ILLEGAL_STATE). Built with -DNO_CHECKPOINT it lacks the checkpoint API, like a
 * driver older than 570.
 *
 * Preloaded into a process (LD_PRELOAD), its path ends in libcuda.so.1 in /proc/PID/maps,
 * which is what marks the process as a CUDA user. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifndef STATE_DIR
#error "build with -DSTATE_DIR=\"/some/dir\""
#endif

enum { SUCCESS = 0, INVALID_VALUE = 1, ILLEGAL_STATE = 401, NOT_READY = 600 };

int cuInit(unsigned flags) { return flags == 0 ? SUCCESS : INVALID_VALUE; }
int cuDriverGetVersion(int *v) { *v = 13000; return SUCCESS; }
int cuDeviceGetCount(int *n) { *n = 1; return SUCCESS; }
int cuDeviceGet(int *d, int ordinal) { if (ordinal != 0) return INVALID_VALUE; *d = 0; return SUCCESS; }
int cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    snprintf(name, (size_t)len, "Fake GPU");
    return SUCCESS;
}
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = (size_t)1 << 30; return SUCCESS; }

static const char *name_of(int code) {
    switch (code) {
    case SUCCESS: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
    case NOT_READY: return "CUDA_ERROR_NOT_READY";
    default: return NULL;
    }
}
int cuGetErrorName(int code, const char **s) { *s = name_of(code); return *s ? SUCCESS : INVALID_VALUE; }
int cuGetErrorString(int code, const char **s) {
    *s = name_of(code) ? "fake driver error" : NULL;
    return *s ? SUCCESS : INVALID_VALUE;
}

#ifndef NO_CHECKPOINT
static void path_of(char *buf, size_t len, int pid, const char *ext) {
    snprintf(buf, len, "%s/%d.%s", STATE_DIR, pid, ext);
}

static int get(int pid) {
    char path[4096];
    int state = 0;
    path_of(path, sizeof path, pid, "state");
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%d", &state) != 1) state = 0;
        fclose(f);
    }
    return state;
}

static void put(int pid, int state) {
    char path[4096];
    path_of(path, sizeof path, pid, "state");
    FILE *f = fopen(path, "w");
    if (f) { fprintf(f, "%d\n", state); fclose(f); }
}

static int should_fail(int pid, const char *call) {
    char path[4096], line[256];
    int fail = 0;
    path_of(path, sizeof path, pid, "fail");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strcmp(line, call) == 0) fail = 1;
    }
    fclose(f);
    return fail;
}

/* The args structs are 64 bytes; everything from byte `from` on must be zero. */
static int zeroed(const void *args, size_t from) {
    const unsigned char *b = args;
    if (!b) return 0;
    for (size_t i = from; i < 64; i++)
        if (b[i]) return 0;
    return 1;
}

static int step(int pid, const char *name, const char *logged, int from, int to, int fail_code) {
    char path[4096];
    if (should_fail(pid, name)) return fail_code;
    if (get(pid) != from) return ILLEGAL_STATE;
    put(pid, to);
    path_of(path, sizeof path, pid, "calls");
    FILE *f = fopen(path, "a");
    if (f) { fprintf(f, "%s\n", logged); fclose(f); }
    return SUCCESS;
}

int cuCheckpointProcessGetState(int pid, int *state) { *state = get(pid); return SUCCESS; }
int cuCheckpointProcessLock(int pid, void *args) {
    char logged[64];
    if (!zeroed(args, 4)) return INVALID_VALUE;
    snprintf(logged, sizeof logged, "lock %u", *(const unsigned *)args);
    return step(pid, "lock", logged, 0, 1, NOT_READY);
}
int cuCheckpointProcessCheckpoint(int pid, void *args) {
    return zeroed(args, 0) ? step(pid, "checkpoint", "checkpoint", 1, 2, ILLEGAL_STATE) : INVALID_VALUE;
}
int cuCheckpointProcessRestore(int pid, void *args) {
    return zeroed(args, 0) ? step(pid, "restore", "restore", 2, 1, ILLEGAL_STATE) : INVALID_VALUE;
}
int cuCheckpointProcessUnlock(int pid, void *args) {
    return zeroed(args, 0) ? step(pid, "unlock", "unlock", 1, 0, ILLEGAL_STATE) : INVALID_VALUE;
}
int cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) { *tid = pid; return SUCCESS; }
#endif
