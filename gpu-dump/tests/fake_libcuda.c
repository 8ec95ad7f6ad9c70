/* A stand-in for libcuda, for tests on machines without a GPU: the device queries answer for
 * one "Fake GPU", and the checkpoint API runs the real state machine (running → locked →
 * checkpointed → locked → running) per target pid, kept in STATE_DIR/<pid>.state, appending
 * each successful call's name to STATE_DIR/<pid>.calls ("lock <timeout_ms>" for the lock).
 * Non-zero reserved argument bytes give CUDA_ERROR_INVALID_VALUE. A call named on a line of
 * STATE_DIR/<pid>.fail fails instead (lock with CUDA_ERROR_NOT_READY, the others with
 * CUDA_ERROR_ILLEGAL_STATE). Built with -DNO_CHECKPOINT it lacks the checkpoint API, like a
 * driver older than 570.
 *
 * The memory API (unless built with -DNO_MEMORY) is backed by host memory: device pointers are
 * malloc'ed host addresses, asynchronous copies are done at once, and there is one device with
 * 1 GiB. Like the real driver it keeps a per-thread current context, and every memory call
 * made on a thread where the (retained) primary context is not current fails with
 * CUDA_ERROR_INVALID_CONTEXT, so a missing cuCtxSetCurrent shows. Unlike the real driver it
 * checks every copy: device ranges must lie inside one live cuMemAlloc block and the source of
 * an asynchronous copy inside one cuMemHostRegister'ed block (else CUDA_ERROR_INVALID_VALUE), and
 * handles must be live (else CUDA_ERROR_INVALID_HANDLE). Tests read its counters and steer it
 * through the exported fake_cuda_* functions at the end.
 *
 * A process "holds a CUDA context" when its environment (/proc/PID/environ) has
 * FAKE_CUDA_CONTEXT=1 and it is not a copy its parent forked that has not exec'd yet: only
 * then does cuCheckpointProcessGetRestoreThreadId answer (with the pid), as the real driver
 * answers only for processes with a context; others get CUDA_ERROR_INVALID_VALUE.
 *
 * Built with -DFAKE_GPUS=N it has N identical GPUs (UUIDs fa4e…0N), with -DFAKE_VERSION=V it
 * reports CUDA version V (e.g. 12080: restore args must be all zero, as before GPU pairs).
 *
 * Preloaded into a process (LD_PRELOAD), its path ends in libcuda.so.1 in /proc/PID/maps,
 * which is what marks the process as a CUDA user. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#ifndef STATE_DIR
#error "build with -DSTATE_DIR=\"/some/dir\""
#endif

enum {
    SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400, ILLEGAL_STATE = 401, NOT_READY = 600
};

static int initialized;

int cuInit(unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    __atomic_store_n(&initialized, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}
#ifndef FAKE_GPUS
#define FAKE_GPUS 1
#endif
#ifndef FAKE_VERSION
#define FAKE_VERSION 13000
#endif
int cuDriverGetVersion(int *v) { *v = FAKE_VERSION; return SUCCESS; }
int cuDeviceGetCount(int *n) { *n = FAKE_GPUS; return SUCCESS; }
int cuDeviceGet(int *d, int ordinal) {
    if (ordinal < 0 || ordinal >= FAKE_GPUS) return INVALID_VALUE;
    *d = ordinal;
    return SUCCESS;
}
int cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    snprintf(name, (size_t)len, "Fake GPU");
    return SUCCESS;
}
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = (size_t)1 << 30; return SUCCESS; }
/* Device i's UUID: fa 4e, then zeros, then i in the last byte. */
int cuDeviceGetUuid_v2(unsigned char *uuid, int dev) {
    if (dev < 0 || dev >= FAKE_GPUS) return INVALID_VALUE;
    memset(uuid, 0, 16);
    uuid[0] = 0xfa; uuid[1] = 0x4e; uuid[15] = (unsigned char)dev;
    return SUCCESS;
}

static const char *name_of(int code) {
    switch (code) {
    case SUCCESS: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
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
/* The device whose UUID this is, or -1. */
static int device_of(const unsigned char *uuid) {
    for (int i = 2; i < 15; i++)
        if (uuid[i]) return -1;
    return uuid[0] == 0xfa && uuid[1] == 0x4e && uuid[15] < FAKE_GPUS ? uuid[15] : -1;
}
/* From CUDA 13.0 the args carry GPU pairs (pointer @0, count @8, 32 bytes each: old UUID,
 * new UUID), logged as "restore OLD>NEW,..." by device; before, they are all reserved. */
int cuCheckpointProcessRestore(int pid, void *args) {
    const unsigned char *b = args;
    unsigned count;
    const unsigned char *pairs;
    char logged[256] = "restore";
    if (!b) return INVALID_VALUE;
    if (FAKE_VERSION < 13000 || zeroed(args, 0))
        return zeroed(args, 0) ? step(pid, "restore", logged, 2, 1, ILLEGAL_STATE) : INVALID_VALUE;
    memcpy(&pairs, b, sizeof pairs);
    memcpy(&count, b + 8, sizeof count);
    if (!zeroed(args, 12) || !pairs || count == 0 || count > FAKE_GPUS) return INVALID_VALUE;
    for (unsigned i = 0; i < count; i++) {
        int old = device_of(pairs + 32 * i), new = device_of(pairs + 32 * i + 16);
        if (old < 0 || new < 0) return INVALID_VALUE;
        snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s%d>%d", i ? "," : " ", old, new);
    }
    return step(pid, "restore", logged, 2, 1, ILLEGAL_STATE);
}
int cuCheckpointProcessUnlock(int pid, void *args) {
    return zeroed(args, 0) ? step(pid, "unlock", "unlock", 1, 0, ILLEGAL_STATE) : INVALID_VALUE;
}
/* Reads /proc/<pid>/<name> into buf (at most len - 1 bytes, NUL-terminated); its length. */
static size_t proc_read(int pid, const char *name, char *buf, size_t len) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, name);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = 0;
    return n;
}
/* The parent of pid, or 0. */
static int parent_of(int pid) {
    char stat[1024];
    if (!proc_read(pid, "stat", stat, sizeof stat)) return 0;
    const char *end = strrchr(stat, ')');
    int ppid = 0;
    return end && sscanf(end + 1, " %*c %d", &ppid) == 1 ? ppid : 0;
}
/* A process holds a context when its environment says so, unless it is a copy its parent
 * forked and that has not exec'd yet (same command line as the parent): the real driver gives
 * a forked child no context (tests/gpu/restore_tid_probe.py), and a shell of the test trees
 * forks such a copy before every command it runs. */
static int has_context(int pid) {
    char env[65536], cmd[8192], parent_cmd[8192];
    size_t n = proc_read(pid, "environ", env, sizeof env);
    int marked = 0;
    for (size_t i = 0; i < n; i += strlen(env + i) + 1) {
        if (strcmp(env + i, "FAKE_CUDA_CONTEXT=1") == 0) marked = 1;
    }
    if (!marked) return 0;
    int ppid = parent_of(pid);
    size_t c = proc_read(pid, "cmdline", cmd, sizeof cmd);
    size_t p = ppid ? proc_read(ppid, "cmdline", parent_cmd, sizeof parent_cmd) : 0;
    return !(c && c == p && memcmp(cmd, parent_cmd, c) == 0);
}
int cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
    if (!has_context(pid)) return INVALID_VALUE;
    *tid = pid;
    return SUCCESS;
}
#endif

#ifndef NO_MEMORY
/* ---- The memory API. One lock (a spin lock: no libpthread needed) guards all of it. ---- */

#define TOTAL_MEM ((size_t)1 << 30)
#define ALIGN 256

struct block { uintptr_t base; size_t len; struct block *next; };
struct handle { unsigned magic; };
enum { STREAM_MAGIC = 0x57AE, EVENT_MAGIC = 0xE7E7, DEAD_MAGIC = 0xDEAD };

static int lock_word;
static struct { int magic; } primary_ctx;   /* the one device's primary context */
static long primary_refs;
static __thread void *current_ctx;          /* per-thread current context, as in the driver */
static struct block *device_blocks, *host_blocks;
static size_t device_bytes;
static long live_device, live_host, live_streams, live_events;
static int fail_alloc;

static void lock(void) { while (__atomic_exchange_n(&lock_word, 1, __ATOMIC_ACQUIRE)) sched_yield(); }
static void unlock(void) { __atomic_store_n(&lock_word, 0, __ATOMIC_RELEASE); }

/* SUCCESS when the retained primary context is current on this thread. Call with the lock held. */
static int need_ctx(void) {
    return current_ctx == &primary_ctx && primary_refs > 0 ? SUCCESS : INVALID_CONTEXT;
}

/* The block of `list` that holds [addr, addr + len), or NULL. Call with the lock held. */
static struct block *find(struct block *list, uintptr_t addr, size_t len) {
    for (struct block *b = list; b; b = b->next)
        if (addr >= b->base && len <= b->len && addr - b->base <= b->len - len) return b;
    return NULL;
}

static int add_block(struct block **list, void *p, size_t len) {
    struct block *b = malloc(sizeof *b);
    if (!b) return OUT_OF_MEMORY;
    b->base = (uintptr_t)p;
    b->len = len;
    b->next = *list;
    *list = b;
    return SUCCESS;
}

/* Unlinks the block that starts at `addr`; its length in *len. Call with the lock held. */
static int remove_block(struct block **list, uintptr_t addr, size_t *len) {
    for (struct block **at = list; *at; at = &(*at)->next) {
        if ((*at)->base == addr) {
            struct block *b = *at;
            *at = b->next;
            *len = b->len;
            free(b);
            return SUCCESS;
        }
    }
    return INVALID_VALUE;
}

int cuDevicePrimaryCtxRetain(void **pctx, int dev) {
    if (!__atomic_load_n(&initialized, __ATOMIC_SEQ_CST)) return NOT_INITIALIZED;
    if (dev != 0 || !pctx) return INVALID_VALUE;
    lock();
    primary_refs++;
    unlock();
    *pctx = &primary_ctx;
    return SUCCESS;
}

int cuDevicePrimaryCtxRelease_v2(int dev) {
    int rc = SUCCESS;
    if (dev != 0) return INVALID_VALUE;
    lock();
    if (primary_refs > 0) primary_refs--; else rc = INVALID_CONTEXT;
    unlock();
    return rc;
}

int cuCtxSetCurrent(void *ctx) {
    int rc = SUCCESS;
    lock();
    if (ctx && (ctx != &primary_ctx || primary_refs == 0)) rc = INVALID_CONTEXT;
    else current_ctx = ctx;
    unlock();
    return rc;
}

int cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS) {
        *free_bytes = TOTAL_MEM - device_bytes;
        *total = TOTAL_MEM;
    }
    unlock();
    return rc;
}

int cuMemAlloc_v2(uint64_t *dptr, size_t bytes) {
    void *p = NULL;
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS && bytes == 0) rc = INVALID_VALUE;
    if (rc == SUCCESS) {
        size_t rounded = (bytes + ALIGN - 1) / ALIGN * ALIGN;
        if (__atomic_load_n(&fail_alloc, __ATOMIC_SEQ_CST) || rounded < bytes || rounded > TOTAL_MEM - device_bytes) rc = OUT_OF_MEMORY;
        else if (posix_memalign(&p, ALIGN, rounded) != 0) rc = OUT_OF_MEMORY;
        else if ((rc = add_block(&device_blocks, p, bytes)) != SUCCESS) free(p);
        else { device_bytes += rounded; live_device++; *dptr = (uint64_t)(uintptr_t)p; }
    }
    unlock();
    return rc;
}

int cuMemFree_v2(uint64_t dptr) {
    size_t len = 0;
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS) rc = remove_block(&device_blocks, (uintptr_t)dptr, &len);
    if (rc == SUCCESS) {
        free((void *)(uintptr_t)dptr);
        device_bytes -= (len + ALIGN - 1) / ALIGN * ALIGN;
        live_device--;
    }
    unlock();
    return rc;
}

/* IPC handles name a live device block of this process (its pid and address); another
 * process's handle gives CUDA_ERROR_INVALID_VALUE: fake device memory is this process's. */
typedef struct { unsigned char reserved[64]; } ipc_handle;

int cuIpcGetMemHandle(ipc_handle *handle, uint64_t dptr) {
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS && !find(device_blocks, (uintptr_t)dptr, 1)) rc = INVALID_VALUE;
    if (rc == SUCCESS) {
        int pid = getpid();
        memset(handle->reserved, 0, 64);
        memcpy(handle->reserved, &pid, sizeof pid);
        memcpy(handle->reserved + 8, &dptr, sizeof dptr);
    }
    unlock();
    return rc;
}

int cuIpcOpenMemHandle_v2(uint64_t *dptr, ipc_handle handle, unsigned flags) {
    int pid;
    uint64_t at;
    memcpy(&pid, handle.reserved, sizeof pid);
    memcpy(&at, handle.reserved + 8, sizeof at);
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS && (flags > 1 || pid != getpid() || !find(device_blocks, (uintptr_t)at, 1))) rc = INVALID_VALUE;
    if (rc == SUCCESS) *dptr = at;
    unlock();
    return rc;
}

int cuIpcCloseMemHandle(uint64_t dptr) {
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS && !find(device_blocks, (uintptr_t)dptr, 1)) rc = INVALID_VALUE;
    unlock();
    return rc;
}

/* Registered memory is pinned: the source of an asynchronous copy must lie inside one block. */
int cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags) {
    (void)flags;
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS && (bytes == 0 || !p)) rc = INVALID_VALUE;
    if (rc == SUCCESS && (rc = add_block(&host_blocks, p, bytes)) == SUCCESS) live_host++;
    unlock();
    return rc;
}

int cuMemHostUnregister(void *p) {
    size_t len = 0;
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS) rc = remove_block(&host_blocks, (uintptr_t)p, &len);
    if (rc == SUCCESS) live_host--;
    unlock();
    return rc;
}

/* A copy to or from device memory: [dev, dev + len) must lie in one live device block and,
 * when `pinned_src`, [host, host + len) in one pinned block. */
static int copy(uint64_t dev, void *host, size_t len, int to_device, int pinned_src) {
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS && !find(device_blocks, (uintptr_t)dev, len)) rc = INVALID_VALUE;
    if (rc == SUCCESS && pinned_src && !find(host_blocks, (uintptr_t)host, len)) rc = INVALID_VALUE;
    if (rc == SUCCESS && len > 0) {
        if (to_device) memcpy((void *)(uintptr_t)dev, host, len);
        else memcpy(host, (const void *)(uintptr_t)dev, len);
    }
    unlock();
    return rc;
}

/* A live handle of kind `magic`; NULL stands for the default stream when `null_ok`. */
static int live(const void *h, unsigned magic, int null_ok) {
    if (!h) return null_ok ? SUCCESS : INVALID_HANDLE;
    return ((const struct handle *)h)->magic == magic ? SUCCESS : INVALID_HANDLE;
}

int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t len) { return copy(dst, (void *)src, len, 1, 0); }
int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t len) { return copy(src, dst, len, 0, 0); }
int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t len, void *stream) {
    int rc = live(stream, STREAM_MAGIC, 1);
    return rc == SUCCESS ? copy(dst, (void *)src, len, 1, 1) : rc;
}

static int create(void **out, unsigned magic, long *counter) {
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS) {
        struct handle *h = malloc(sizeof *h);
        if (!h) rc = OUT_OF_MEMORY;
        else { h->magic = magic; (*counter)++; *out = h; }
    }
    unlock();
    return rc;
}

static int destroy(void *h, unsigned magic, long *counter) {
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS) rc = live(h, magic, 0);
    if (rc == SUCCESS) { ((struct handle *)h)->magic = DEAD_MAGIC; free(h); (*counter)--; }
    unlock();
    return rc;
}

static int use(void *h, unsigned magic, int null_ok) {
    lock();
    int rc = need_ctx();
    if (rc == SUCCESS) rc = live(h, magic, null_ok);
    unlock();
    return rc;
}

int cuStreamCreate(void **stream, unsigned flags) {
    return flags <= 1 ? create(stream, STREAM_MAGIC, &live_streams) : INVALID_VALUE;
}
int cuStreamDestroy_v2(void *stream) { return destroy(stream, STREAM_MAGIC, &live_streams); }
int cuStreamSynchronize(void *stream) { return use(stream, STREAM_MAGIC, 1); }
int cuEventCreate(void **event, unsigned flags) {
    return flags <= 15 ? create(event, EVENT_MAGIC, &live_events) : INVALID_VALUE;
}
int cuEventRecord(void *event, void *stream) {
    int rc = use(stream, STREAM_MAGIC, 1);
    return rc == SUCCESS ? use(event, EVENT_MAGIC, 0) : rc;
}
int cuEventSynchronize(void *event) { return use(event, EVENT_MAGIC, 0); }
int cuEventDestroy_v2(void *event) { return destroy(event, EVENT_MAGIC, &live_events); }

/* ---- For tests: counters and failure injection. ---- */

static long read_counter(const long *counter) {
    lock();
    long value = *counter;
    unlock();
    return value;
}

long fake_cuda_live_device_allocs(void) { return read_counter(&live_device); }
long fake_cuda_live_host_allocs(void) { return read_counter(&live_host); }
long fake_cuda_live_streams(void) { return read_counter(&live_streams); }
long fake_cuda_live_events(void) { return read_counter(&live_events); }
long fake_cuda_primary_ctx_refs(void) { return read_counter(&primary_refs); }
/* Non-zero: every cuMemAlloc_v2 fails with CUDA_ERROR_OUT_OF_MEMORY. */
void fake_cuda_fail_alloc(int fail) { __atomic_store_n(&fail_alloc, fail, __ATOMIC_SEQ_CST); }
#endif
