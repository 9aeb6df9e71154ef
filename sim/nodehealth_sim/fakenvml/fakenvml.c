/*
 * fakenvml: a fake libnvidia-ml.so.1 that the unmodified nvidia-ml-py (pynvml) loads, answering from a node
 * description (the "spec", docs/fake-nvml.md) read from $NODEHEALTH_FAKE_NVML_SPEC at every nvmlInit*.
 *
 * One source, built once per driver branch with -DNVML_BRANCH=<n>; a linker version script generated from
 * symbols.tsv exports exactly the symbols that branch's nvml.h declares and hides the rest, so pynvml sees
 * NVMLError_FunctionNotFound (or NVMLLibraryMismatchError) where the real library of that branch would give it.
 * Signatures, enum values and struct layouts follow NVIDIA's nvml.h as kept by github.com/NVIDIA/go-nvml
 * (gen/nvml/nvml.h; commits in symbols.tsv). Every exported function goes through call_begin()/call_end():
 * injected delays, hangs and errors, and the call log.
 */
#define _GNU_SOURCE
#include "fakenvml.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SPEC_ENV "NODEHEALTH_FAKE_NVML_SPEC"
#define LOG_ENV "NODEHEALTH_FAKE_NVML_LOG"

#define MAX_GPUS 64
#define MAX_LINKS 18 /* NVML_NVLINK_MAX_LINKS of the 12.x/13.x headers */
#define MAX_PROCS 64
#define MAX_UNSUP 16
#define MAX_RULES 256
#define NAME_LEN 64

/* Numeric per-GPU keys: `gpu <i> <key> <number>`. */
enum key {
    K_PCI_DEVICE_ID, K_PCI_SUBSYSTEM_ID, K_ARCH, K_TEMP, K_SLOWDOWN, K_SHUTDOWN, K_GPU_MAX, K_MEM_MAX, K_MEM_TEMP,
    K_POWER, K_POWER_LIMIT, K_UTIL_GPU, K_UTIL_MEM, K_MEM_TOTAL, K_MEM_USED, K_MEM_RESERVED, K_ECC_CUR, K_ECC_PEND,
    K_ECC_VOL_C, K_ECC_VOL_U, K_ECC_AGG_C, K_ECC_AGG_U, K_RET_SBE, K_RET_DBE, K_RET_PEND, K_REMAP_C, K_REMAP_U,
    K_REMAP_P, K_REMAP_F, K_PCIE_GEN, K_PCIE_MAX_GEN, K_PCIE_W, K_PCIE_MAX_W, K_NVL_LINKS, K_NVL_COUNTERS,
    K_FAB_STATE, K_FAB_STATUS, K_FAB_CLIQUE, K_FAB_HMASK, K_FAB_HSUM, K_THROTTLE, K_PERSIST, K_RECOVERY, K_MIG_CUR,
    K_MIG_PEND, K_INIT_MS, K_MINOR, K_POWER_DEFAULT, K_THR_POWER, K_THR_THERMAL, K_THR_SYNC_BOOST, K_THR_BOARD,
    K_THR_LOW_UTIL, K_THR_RELIABILITY, K_THR_HW_THERMAL, K_THR_HW_POWER_BRAKE, K_COUNT
};

static const struct {
    const char *name;
    int key;
} NUMKEYS[] = {
    {"pci_device_id", K_PCI_DEVICE_ID}, {"pci_subsystem_id", K_PCI_SUBSYSTEM_ID}, {"architecture", K_ARCH},
    {"temperature_c", K_TEMP}, {"slowdown_c", K_SLOWDOWN}, {"shutdown_c", K_SHUTDOWN}, {"gpu_max_c", K_GPU_MAX},
    {"mem_max_c", K_MEM_MAX}, {"memory_temp_c", K_MEM_TEMP}, {"power_mw", K_POWER},
    {"power_limit_mw", K_POWER_LIMIT}, {"util_gpu", K_UTIL_GPU}, {"util_memory", K_UTIL_MEM},
    {"memory_total", K_MEM_TOTAL}, {"memory_used", K_MEM_USED}, {"memory_reserved", K_MEM_RESERVED},
    {"ecc_current", K_ECC_CUR}, {"ecc_pending", K_ECC_PEND}, {"ecc_vol_corrected", K_ECC_VOL_C},
    {"ecc_vol_uncorrected", K_ECC_VOL_U}, {"ecc_agg_corrected", K_ECC_AGG_C},
    {"ecc_agg_uncorrected", K_ECC_AGG_U}, {"retired_sbe", K_RET_SBE}, {"retired_dbe", K_RET_DBE},
    {"retired_pending", K_RET_PEND}, {"remap_corrected", K_REMAP_C}, {"remap_uncorrected", K_REMAP_U},
    {"remap_pending", K_REMAP_P}, {"remap_failure", K_REMAP_F}, {"pcie_gen", K_PCIE_GEN},
    {"pcie_max_gen", K_PCIE_MAX_GEN}, {"pcie_width", K_PCIE_W}, {"pcie_max_width", K_PCIE_MAX_W},
    {"nvlink_links", K_NVL_LINKS}, {"nvlink_counters", K_NVL_COUNTERS}, {"fabric_state", K_FAB_STATE},
    {"fabric_status", K_FAB_STATUS}, {"fabric_clique", K_FAB_CLIQUE}, {"fabric_health_mask", K_FAB_HMASK},
    {"fabric_health_summary", K_FAB_HSUM}, {"throttle", K_THROTTLE}, {"persistence", K_PERSIST},
    {"recovery_action", K_RECOVERY}, {"mig_current", K_MIG_CUR}, {"mig_pending", K_MIG_PEND},
    {"init_ms", K_INIT_MS}, {"minor_number", K_MINOR}, {"power_default_mw", K_POWER_DEFAULT},
    {"throttle_power_ns", K_THR_POWER}, {"throttle_thermal_ns", K_THR_THERMAL},
    {"throttle_sync_boost_ns", K_THR_SYNC_BOOST}, {"throttle_board_limit_ns", K_THR_BOARD},
    {"throttle_low_utilization_ns", K_THR_LOW_UTIL}, {"throttle_reliability_ns", K_THR_RELIABILITY},
    {"throttle_hw_thermal_ns", K_THR_HW_THERMAL}, {"throttle_hw_power_brake_ns", K_THR_HW_POWER_BRAKE},
};

struct proc {
    unsigned int pid;
    unsigned long long bytes;
};

struct gpu {
    unsigned char has[K_COUNT];
    unsigned long long v[K_COUNT];
    int has_name, has_uuid, has_serial, has_pci, has_cc, has_procs;
    char name[96], uuid[96], serial[32];
    unsigned int domain, bus, dev;
    int cc_major, cc_minor;
    unsigned long long nvl_down;                /* bit per link */
    unsigned long long nvl[MAX_LINKS][4];       /* replay, recovery, crc_flit, crc_data */
    int nprocs;
    struct proc procs[MAX_PROCS];
    int nunsup;
    char unsup[MAX_UNSUP][NAME_LEN];            /* base names */
};

enum rule_kind { R_ERROR, R_HANG, R_DELAY, R_FIELD };
struct rule {
    int kind;
    char fn[NAME_LEN]; /* base name, or "*" (delay only); R_FIELD: unused */
    unsigned field;    /* R_FIELD: the field id whose value answers arg */
    int gpu;           /* -1 = any ("*") */
    unsigned long long arg;
};

struct spec {
    char driver_version[80];
    int cuda_version;
    int init_error;
    int ngpus;
    struct gpu gpu[MAX_GPUS];
    int nrules;
    struct rule rules[MAX_RULES];
};

static struct spec S;          /* the node as parsed by the last successful nvmlInit* */
static struct spec PARSE;      /* scratch for the parser, copied to S on success */
static int refcount;           /* nvmlInit* successes minus nvmlShutdown */
static int opened[MAX_GPUS];   /* init_ms: the first open of each GPU in this process has been paid */
static struct nvmlDevice_st HANDLES[MAX_GPUS];
static pthread_mutex_t LOCK = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -2;        /* -2: not looked up yet, -1: no log */

/* ------------------------------------------------------------------------------------------------------------ */
/* time */

static long long now_us(clockid_t clk) {
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void sleep_us(unsigned long long us) {
    struct timespec ts = {(time_t)(us / 1000000ULL), (long)(us % 1000000ULL) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* names: a rule's <function> matches the base name, the symbol without a trailing _v<N>; every nvmlInit* is
 * "nvmlInit" */

static void base_name(const char *sym, char *out) {
    size_t n = strlen(sym);
    if (n >= NAME_LEN) n = NAME_LEN - 1;
    memcpy(out, sym, n);
    out[n] = 0;
    if (strcmp(out, "nvmlInitWithFlags") == 0) {
        strcpy(out, "nvmlInit");
        return;
    }
    char *p = out + n;
    while (p > out && p[-1] >= '0' && p[-1] <= '9') p--;
    if (p < out + n && p - out >= 2 && p[-1] == 'v' && p[-2] == '_') p[-2] = 0;
}

static const char *const KNOWN[] = {
    "nvmlInit", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetPciInfo", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetPowerManagementDefaultLimit",
};

static int known_function(const char *base) {
    for (size_t i = 0; i < sizeof(KNOWN) / sizeof(KNOWN[0]); i++)
        if (strcmp(KNOWN[i], base) == 0) return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* the call log and the common entry */

struct call {
    const char *sym;
    char base[NAME_LEN];
    int gpu;
    long long t0;
    int nvals; /* nvmlDeviceGetFieldValues: values requested; -1 otherwise */
};

static void log_line(const struct call *c, nvmlReturn_t rc) {
    int fd = __atomic_load_n(&log_fd, __ATOMIC_ACQUIRE);
    if (fd == -2) {
        const char *path = getenv(LOG_ENV);
        fd = (path && *path) ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
        int expected = -2;
        if (!__atomic_compare_exchange_n(&log_fd, &expected, fd, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            if (fd >= 0) close(fd);
            fd = expected;
        }
    }
    if (fd < 0) return;
    char buf[192];
    long long us = now_us(CLOCK_MONOTONIC) - c->t0;
    int n = c->nvals >= 0 ? snprintf(buf, sizeof buf, "%s %d %d %lld %d\n", c->sym, c->gpu, rc, us, c->nvals)
                          : snprintf(buf, sizeof buf, "%s %d %d %lld\n", c->sym, c->gpu, rc, us);
    if (n > 0 && (size_t)n < sizeof buf) {
        ssize_t w = write(fd, buf, (size_t)n); /* one O_APPEND write: lines from threads/processes don't mix */
        (void)w;
    }
}

static int rule_matches(const struct rule *r, const struct call *c, int allow_star_fn) {
    if (r->gpu >= 0 && r->gpu != c->gpu) return 0;
    if (allow_star_fn && strcmp(r->fn, "*") == 0) return 1;
    return strcmp(r->fn, c->base) == 0;
}

/* Delays (summed) and hangs of the rules that match this call. */
static void apply_timing(const struct call *c) {
    unsigned long long delay = 0;
    int hang = 0;
    for (int i = 0; i < S.nrules; i++) {
        const struct rule *r = &S.rules[i];
        if (r->kind == R_DELAY && rule_matches(r, c, 1)) delay += r->arg;
        if (r->kind == R_HANG && rule_matches(r, c, 0)) hang = 1;
    }
    if (delay) sleep_us(delay);
    if (hang)
        for (;;) sleep_us(1000000ULL); /* a wedged driver call: never returns */
}

/* The code of the first `error` rule that matches, or 0. */
static nvmlReturn_t injected(const struct call *c) {
    for (int i = 0; i < S.nrules; i++) {
        const struct rule *r = &S.rules[i];
        if (r->kind == R_ERROR && rule_matches(r, c, 0)) return (nvmlReturn_t)r->arg;
    }
    return NVML_SUCCESS;
}

static void call_start(struct call *c, const char *sym, int gpu) {
    c->sym = sym;
    base_name(sym, c->base);
    c->gpu = gpu;
    c->nvals = -1;
    c->t0 = now_us(CLOCK_MONOTONIC);
}

static void call_begin(struct call *c, const char *sym, int gpu) {
    call_start(c, sym, gpu);
    apply_timing(c);
}

static nvmlReturn_t call_end(const struct call *c, nvmlReturn_t rc) {
    log_line(c, rc);
    return rc;
}

static int initialised(void) { return __atomic_load_n(&refcount, __ATOMIC_ACQUIRE) > 0; }

static int dev_index(nvmlDevice_t device) {
    uintptr_t p = (uintptr_t)device, lo = (uintptr_t)&HANDLES[0], hi = (uintptr_t)&HANDLES[MAX_GPUS];
    if (p < lo || p >= hi || (p - lo) % sizeof(HANDLES[0]) != 0) return -1;
    int i = (int)((p - lo) / sizeof(HANDLES[0]));
    return i < S.ngpus ? i : -1;
}

static int unsupported(const struct gpu *g, const struct call *c) {
    for (int i = 0; i < g->nunsup; i++)
        if (strcmp(g->unsup[i], c->base) == 0) return 1;
    return 0;
}

#define RET(x) return call_end(&c_, (x))

#define SYS_ENTER(SYM)                                       \
    struct call c_;                                          \
    call_begin(&c_, SYM, -1);                                \
    if (!initialised()) RET(NVML_ERROR_UNINITIALIZED);       \
    {                                                        \
        nvmlReturn_t e_ = injected(&c_);                     \
        if (e_) RET(e_);                                     \
    }

/* Device calls: uninitialised, bad handle, injected error, `unsupported`, then the call's own checks. */
#define DEV_ENTER(SYM)                                       \
    struct call c_;                                          \
    int gi_ = dev_index(device);                             \
    call_begin(&c_, SYM, gi_);                               \
    if (!initialised()) RET(NVML_ERROR_UNINITIALIZED);       \
    if (gi_ < 0) RET(NVML_ERROR_INVALID_ARGUMENT);           \
    {                                                        \
        nvmlReturn_t e_ = injected(&c_);                     \
        if (e_) RET(e_);                                     \
    }                                                        \
    const struct gpu *G = &S.gpu[gi_];                       \
    if (unsupported(G, &c_)) RET(NVML_ERROR_NOT_SUPPORTED);

#define NEED(k)                                              \
    if (!G->has[k]) RET(NVML_ERROR_NOT_SUPPORTED)
#define NONNULL(p)                                           \
    if (!(p)) RET(NVML_ERROR_INVALID_ARGUMENT)

/* ------------------------------------------------------------------------------------------------------------ */
/* the spec parser */

static int parse_line_no;
static char parse_msg[160];

static int perr(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(parse_msg, sizeof parse_msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_ull(const char *s, unsigned long long *out) {
    if (!s || !*s || *s == '-') return -1;
    char *end;
    errno = 0;
    int base = (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    unsigned long long v;
    if (parse_ull(s, &v) || v < (unsigned long long)lo || v > (unsigned long long)hi) return -1;
    *out = (int)v;
    return 0;
}

/* "00000000:18:00.0", "0000:18:00.0" or "18:00.0" (hex, any case) -> domain, bus, device */
static int parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *dev) {
    unsigned a, b, c, f;
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &f, &tail) == 4) {
        *domain = a, *bus = b, *dev = c;
    } else if (sscanf(s, "%x:%x.%x%c", &b, &c, &f, &tail) == 3) {
        *domain = 0, *bus = b, *dev = c;
    } else {
        return -1;
    }
    return (*bus > 0xff || *dev > 0x1f) ? -1 : 0;
}

static int add_rule(struct spec *sp, int kind, char **tok, int ntok) {
    /* tok[0] is the directive */
    int want = kind == R_HANG ? 3 : 4;
    if (ntok != want) return perr("%s takes %d arguments", tok[0], want - 1);
    if (sp->nrules >= MAX_RULES) return perr("more than %d error/hang/delay rules", MAX_RULES);
    struct rule *r = &sp->rules[sp->nrules];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    if (kind == R_FIELD) {
        int id;
        if (parse_int(tok[1], 0, 100000, &id)) return perr("bad field id '%s'", tok[1]);
        r->field = (unsigned)id;
        strcpy(r->fn, "nvmlDeviceGetFieldValues");
    } else if (kind == R_DELAY && strcmp(tok[1], "*") == 0) {
        strcpy(r->fn, "*");
    } else {
        base_name(tok[1], r->fn);
        if (!known_function(r->fn)) return perr("unknown function '%s'", tok[1]);
    }
    if (strcmp(tok[2], "*") == 0) r->gpu = -1;
    else if (parse_int(tok[2], 0, MAX_GPUS - 1, &r->gpu)) return perr("bad gpu '%s'", tok[2]);
    if (kind != R_HANG && parse_ull(tok[3], &r->arg)) return perr("bad number '%s'", tok[3]);
    if ((kind == R_ERROR || kind == R_FIELD) && r->arg > 0x7fffffffULL) return perr("bad return code '%s'", tok[3]);
    sp->nrules++;
    return 0;
}

static int copy_str(char *dst, size_t cap, const char *src) {
    if (strlen(src) >= cap) return -1;
    strcpy(dst, src);
    return 0;
}

/* `gpu <i> <key> <value...>`; `rest` is the unsplit text after <key> (for `name`). */
static int gpu_line(struct spec *sp, char **tok, int ntok, const char *rest, int *max_gpu_line, int *max_gpu) {
    int i;
    if (ntok < 4) return perr("gpu takes <index> <key> <value>");
    if (parse_int(tok[1], 0, MAX_GPUS - 1, &i)) return perr("bad gpu index '%s' (0..%d)", tok[1], MAX_GPUS - 1);
    if (i > *max_gpu) *max_gpu = i, *max_gpu_line = parse_line_no;
    struct gpu *g = &sp->gpu[i];
    const char *k = tok[2];
    if (strcmp(k, "name") == 0) {
        if (copy_str(g->name, sizeof g->name, rest)) return perr("name too long");
        g->has_name = 1;
        return 0;
    }
    if (strcmp(k, "nvlink") == 0) {
        int link;
        if (ntok != 8) return perr("nvlink takes <link> <replay> <recovery> <crc_flit> <crc_data>");
        if (parse_int(tok[3], 0, MAX_LINKS - 1, &link)) return perr("bad link '%s'", tok[3]);
        for (int j = 0; j < 4; j++)
            if (parse_ull(tok[4 + j], &g->nvl[link][j])) return perr("bad counter '%s'", tok[4 + j]);
        return 0;
    }
    if (ntok != 4) return perr("gpu key '%s' takes one value", k);
    const char *val = tok[3];
    if (strcmp(k, "uuid") == 0) {
        if (copy_str(g->uuid, sizeof g->uuid, val)) return perr("uuid too long");
        g->has_uuid = 1;
    } else if (strcmp(k, "serial") == 0) {
        if (copy_str(g->serial, sizeof g->serial, val)) return perr("serial too long");
        g->has_serial = 1;
    } else if (strcmp(k, "pci_bus_id") == 0) {
        if (parse_bus_id(val, &g->domain, &g->bus, &g->dev)) return perr("bad pci_bus_id '%s'", val);
        g->has_pci = 1;
    } else if (strcmp(k, "cc") == 0) {
        char tail;
        if (sscanf(val, "%d.%d%c", &g->cc_major, &g->cc_minor, &tail) != 2 || g->cc_major < 0 || g->cc_minor < 0)
            return perr("bad cc '%s' (major.minor)", val);
        g->has_cc = 1;
    } else if (strcmp(k, "nvlink_down") == 0) {
        g->nvl_down = 0;
        if (strcmp(val, "-") != 0) {
            char buf[256];
            if (copy_str(buf, sizeof buf, val)) return perr("nvlink_down too long");
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                int link;
                if (parse_int(t, 0, MAX_LINKS - 1, &link)) return perr("bad link '%s'", t);
                g->nvl_down |= 1ULL << link;
            }
        }
    } else if (strcmp(k, "processes") == 0) {
        g->nprocs = 0;
        g->has_procs = 1;
        if (strcmp(val, "-") != 0) {
            char buf[4096];
            if (copy_str(buf, sizeof buf, val)) return perr("processes too long");
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                char *colon = strchr(t, ':');
                unsigned long long pid, bytes;
                if (!colon) return perr("bad process '%s' (pid:bytes)", t);
                *colon = 0;
                if (parse_ull(t, &pid) || pid > 0xffffffffULL || parse_ull(colon + 1, &bytes))
                    return perr("bad process '%s:%s' (pid:bytes)", t, colon + 1);
                if (g->nprocs >= MAX_PROCS) return perr("more than %d processes", MAX_PROCS);
                g->procs[g->nprocs].pid = (unsigned)pid;
                g->procs[g->nprocs].bytes = bytes;
                g->nprocs++;
            }
        }
    } else if (strcmp(k, "unsupported") == 0) {
        if (g->nunsup >= MAX_UNSUP) return perr("more than %d unsupported lines", MAX_UNSUP);
        base_name(val, g->unsup[g->nunsup]);
        if (!known_function(g->unsup[g->nunsup])) return perr("unknown function '%s'", val);
        g->nunsup++;
    } else {
        size_t n;
        for (n = 0; n < sizeof(NUMKEYS) / sizeof(NUMKEYS[0]); n++)
            if (strcmp(NUMKEYS[n].name, k) == 0) break;
        if (n == sizeof(NUMKEYS) / sizeof(NUMKEYS[0])) return perr("unknown gpu key '%s'", k);
        int key = NUMKEYS[n].key;
        if (parse_ull(val, &g->v[key])) return perr("bad number '%s' for %s", val, k);
        if (key == K_NVL_LINKS && g->v[key] > MAX_LINKS) return perr("nvlink_links over %d", MAX_LINKS);
        g->has[key] = 1;
    }
    return 0;
}

static int parse_spec(const char *text, struct spec *sp) {
    memset(sp, 0, sizeof *sp);
    snprintf(sp->driver_version, sizeof sp->driver_version, "%d.00.00", NVML_BRANCH);
    sp->cuda_version = FAKE_CUDA_DEFAULT;
    int max_gpu = -1, max_gpu_line = 0;
    const char *p = text;
    parse_line_no = 0;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[8192];
        parse_line_no++;
        if (len >= sizeof line) return perr("line too long");
        memcpy(line, p, len);
        line[len] = 0;
        p += len + (nl ? 1 : 0);
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char raw[8192];
        strcpy(raw, line);
        char *tok[16];
        int ntok = 0;
        for (char *save = NULL, *t = strtok_r(line, " \t\r", &save); t; t = strtok_r(NULL, " \t\r", &save)) {
            if (ntok == 16) return perr("too many words");
            tok[ntok++] = t;
        }
        if (ntok == 0) continue;
        int rc = 0;
        const char *d = tok[0];
        if (strcmp(d, "version") == 0) {
            if (ntok != 2 || strcmp(tok[1], "1") != 0) rc = perr("only 'version 1' is understood");
        } else if (strcmp(d, "driver_version") == 0) {
            if (ntok != 2 || copy_str(sp->driver_version, sizeof sp->driver_version, tok[1]))
                rc = perr("driver_version takes one word");
        } else if (strcmp(d, "cuda_driver_version") == 0) {
            if (ntok != 2 || parse_int(tok[1], 0, 1000000, &sp->cuda_version))
                rc = perr("cuda_driver_version takes a number (e.g. 12040)");
        } else if (strcmp(d, "init_error") == 0) {
            if (ntok != 2 || parse_int(tok[1], 0, 0x7fffffff, &sp->init_error)) rc = perr("init_error takes a code");
        } else if (strcmp(d, "gpus") == 0) {
            if (ntok != 2 || parse_int(tok[1], 0, MAX_GPUS, &sp->ngpus)) rc = perr("gpus takes 0..%d", MAX_GPUS);
        } else if (strcmp(d, "gpu") == 0) {
            /* the text after the key, for `name` */
            const char *r = raw;
            for (int w = 0; w < 3; w++) {
                r += strspn(r, " \t\r");
                r += strcspn(r, " \t\r");
            }
            r += strspn(r, " \t\r");
            char rest[128];
            size_t rl = strlen(r);
            while (rl && (r[rl - 1] == ' ' || r[rl - 1] == '\t' || r[rl - 1] == '\r')) rl--;
            if (rl >= sizeof rest) rl = sizeof rest - 1;
            memcpy(rest, r, rl);
            rest[rl] = 0;
            rc = gpu_line(sp, tok, ntok, rest, &max_gpu_line, &max_gpu);
        } else if (strcmp(d, "error") == 0) {
            rc = add_rule(sp, R_ERROR, tok, ntok);
        } else if (strcmp(d, "hang") == 0) {
            rc = add_rule(sp, R_HANG, tok, ntok);
        } else if (strcmp(d, "delay") == 0) {
            rc = add_rule(sp, R_DELAY, tok, ntok);
        } else if (strcmp(d, "field_error") == 0) {
            rc = add_rule(sp, R_FIELD, tok, ntok);
        } else {
            rc = perr("unknown directive '%s'", d);
        }
        if (rc) return -1;
    }
    if (max_gpu >= sp->ngpus) {
        parse_line_no = max_gpu_line;
        return perr("gpu %d but 'gpus %d'", max_gpu, sp->ngpus);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* init / shutdown / errors */

static nvmlReturn_t do_init(const char *sym) {
    struct call c_;
    call_start(&c_, sym, -1);
    pthread_mutex_lock(&LOCK);
    /* a new init looks the log up again (the caller may have changed the environment) */
    int old = __atomic_exchange_n(&log_fd, -2, __ATOMIC_ACQ_REL);
    if (old >= 0) close(old);
    const char *text = getenv(SPEC_ENV);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!text) {
        rc = NVML_ERROR_DRIVER_NOT_LOADED;
    } else if (parse_spec(text, &PARSE) != 0) {
        fprintf(stderr, "fakenvml: %s line %d: %s\n", SPEC_ENV, parse_line_no, parse_msg);
        rc = NVML_ERROR_UNKNOWN;
    } else {
        memcpy(&S, &PARSE, sizeof S);
    }
    pthread_mutex_unlock(&LOCK);
    if (rc == NVML_SUCCESS) {
        apply_timing(&c_);
        rc = injected(&c_);
        if (!rc) rc = S.init_error;
        if (!rc) __atomic_add_fetch(&refcount, 1, __ATOMIC_ACQ_REL);
    }
    RET(rc);
}

nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }
nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags; /* NVML_INIT_FLAG_NO_GPUS / _NO_ATTACH: a node with 0 GPUs initialises either way */
    return do_init("nvmlInitWithFlags");
}

nvmlReturn_t nvmlShutdown(void) {
    struct call c_;
    call_begin(&c_, "nvmlShutdown", -1);
    nvmlReturn_t e_ = injected(&c_);
    if (e_) RET(e_);
    int cur = __atomic_load_n(&refcount, __ATOMIC_ACQUIRE);
    while (cur > 0 && !__atomic_compare_exchange_n(&refcount, &cur, cur - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    RET(cur > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED);
}

/* Error strings, each only in the branches whose header has the code (unknown codes: "Unknown Error"). */
static const struct {
    int code, since;
    const char *text;
} ERRSTR[] = {
    {0, 0, "Success"},
    {1, 0, "Uninitialized"},
    {2, 0, "Invalid Argument"},
    {3, 0, "Not Supported"},
    {4, 0, "Insufficient Permissions"},
    {5, 0, "Already Initialized"},
    {6, 0, "Not Found"},
    {7, 0, "Insufficient Size"},
    {8, 0, "Insufficient External Power"},
    {9, 0, "Driver Not Loaded"},
    {10, 0, "Timeout"},
    {11, 0, "Interrupt request issue"},
    {12, 0, "NVML Shared Library Not Found"},
    {13, 0, "Function Not Found"},
    {14, 0, "Corrupted infoROM"},
    {15, 0, "GPU is lost"},
    {16, 0, "GPU requires restart"},
    {17, 0, "The operating system has blocked the request."},
    {18, 0, "RM has detected an NVML/RM version mismatch."},
    {19, 0, "In use by another client"},
    {20, 0, "Insufficient Memory"},
    {21, 0, "No data"},
    {22, 0, "The requested vgpu operation is not available on target device, because ECC is enabled"},
    {23, 0, "Ran out of critical resources, other than memory"},
    {24, 0, "The requested frequency is not supported"},
    {25, 525, "Argument version mismatch"},
    {26, 525, "The requested functionality has been deprecated"},
    {27, 535, "The system is not ready for the request"},
    {28, 550, "No GPUs were found"},
    {29, 550, "Resource is in invalid state"},
    {30, 580, "The requested reset type is not supported"},
};

const char *nvmlErrorString(nvmlReturn_t result) {
    struct call c_;
    call_begin(&c_, "nvmlErrorString", -1);
    const char *s = "Unknown Error";
    for (size_t i = 0; i < sizeof(ERRSTR) / sizeof(ERRSTR[0]); i++)
        if (ERRSTR[i].code == result && NVML_BRANCH >= ERRSTR[i].since) s = ERRSTR[i].text;
    call_end(&c_, NVML_SUCCESS);
    return s;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* system */

static nvmlReturn_t put_str(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    SYS_ENTER("nvmlSystemGetDriverVersion");
    RET(put_str(version, length, S.driver_version));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    SYS_ENTER("nvmlSystemGetNVMLVersion");
    char buf[96];
    snprintf(buf, sizeof buf, "%d.%s", FAKE_NVML_MAJOR, S.driver_version); /* e.g. "12.550.127.05" */
    RET(put_str(version, length, buf));
}

static nvmlReturn_t cuda_version(const char *sym, int *v) {
    SYS_ENTER(sym);
    NONNULL(v);
    *v = S.cuda_version;
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version("nvmlSystemGetCudaDriverVersion", v); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version("nvmlSystemGetCudaDriverVersion_v2", v); }

/* ------------------------------------------------------------------------------------------------------------ */
/* handles */

static nvmlReturn_t get_count(const char *sym, unsigned int *count) {
    SYS_ENTER(sym);
    NONNULL(count);
    *count = (unsigned)S.ngpus;
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return get_count("nvmlDeviceGetCount", n); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { return get_count("nvmlDeviceGetCount_v2", n); }

/* Bringing a GPU up is work, not a wait: the driver opens the GPU's device node and maps memory as it goes. The
 * fake does the same in miniature, so a slow open shows progress to an observer of the process (page faults in
 * /proc/<pid>/stat) while a `hang` (a sleep, as a call blocked in the kernel) shows none: one fresh page is
 * touched every 10 ms of init_ms. */
static void bring_up(unsigned long long ms) {
    enum { SLICE_MS = 10, PAGE = 4096 };
    size_t len = ((size_t)(ms / SLICE_MS) + 1) * PAGE;
    /* mmap, not malloc: fresh pages every time (malloc may hand back pages an earlier open already touched) */
    unsigned char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned long long done = 0; done < ms; done += SLICE_MS) {
        if (mem != MAP_FAILED) mem[(done / SLICE_MS) * PAGE] = 1;
        sleep_us((ms - done < SLICE_MS ? ms - done : SLICE_MS) * 1000ULL);
    }
    if (mem != MAP_FAILED) munmap(mem, len);
}

static void first_open(int i) {
    /* init_ms: a GPU without persistence mode is initialised when the first client opens it (nvml.h,
     * nvmlDeviceGetHandleByIndex_v2: "this API causes NVML to initialize the target GPU") */
    if (S.gpu[i].has[K_INIT_MS] && !__atomic_exchange_n(&opened[i], 1, __ATOMIC_ACQ_REL))
        bring_up(S.gpu[i].v[K_INIT_MS]);
}

static nvmlReturn_t by_index(const char *sym, unsigned int index, nvmlDevice_t *device) {
    struct call c_;
    call_begin(&c_, sym, index < MAX_GPUS ? (int)index : -1);
    if (!initialised()) RET(NVML_ERROR_UNINITIALIZED);
    if (!device || index >= (unsigned)S.ngpus) RET(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t e = injected(&c_); /* the driver counts this GPU but cannot open it */
    if (e) RET(e);
    first_open((int)index);
    HANDLES[index].index = (int)index;
    *device = &HANDLES[index];
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    return by_index("nvmlDeviceGetHandleByIndex", i, d);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    return by_index("nvmlDeviceGetHandleByIndex_v2", i, d);
}

static nvmlReturn_t by_bus_id(const char *sym, const char *bus_id, nvmlDevice_t *device) {
    unsigned dom = 0, bus = 0, dev = 0;
    int found = -1;
    int ok = bus_id && parse_bus_id(bus_id, &dom, &bus, &dev) == 0;
    if (ok)
        for (int i = 0; i < S.ngpus; i++)
            if (S.gpu[i].has_pci && S.gpu[i].domain == dom && S.gpu[i].bus == bus && S.gpu[i].dev == dev) found = i;
    struct call c_;
    call_begin(&c_, sym, found);
    if (!initialised()) RET(NVML_ERROR_UNINITIALIZED);
    if (!device || !bus_id) RET(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t e = injected(&c_);
    if (e) RET(e);
    if (found < 0) RET(NVML_ERROR_NOT_FOUND);
    first_open(found);
    HANDLES[found].index = found;
    *device = &HANDLES[found];
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) {
    return by_bus_id("nvmlDeviceGetHandleByPciBusId", b, d);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *b, nvmlDevice_t *d) {
    return by_bus_id("nvmlDeviceGetHandleByPciBusId_v2", b, d);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* identity */

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV_ENTER("nvmlDeviceGetIndex");
    NONNULL(index);
    *index = (unsigned)gi_;
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEV_ENTER("nvmlDeviceGetMinorNumber");
    NONNULL(minor);
    *minor = G->has[K_MINOR] ? (unsigned)G->v[K_MINOR] : (unsigned)gi_; /* /dev/nvidia<minor> */
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetName");
    if (!G->has_name) RET(NVML_ERROR_NOT_SUPPORTED);
    RET(put_str(name, length, G->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetUUID");
    if (!G->has_uuid) RET(NVML_ERROR_NOT_SUPPORTED);
    RET(put_str(uuid, length, G->uuid));
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetSerial");
    if (!G->has_serial) RET(NVML_ERROR_NOT_SUPPORTED);
    RET(put_str(serial, length, G->serial));
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    DEV_ENTER("nvmlDeviceGetArchitecture");
    NONNULL(arch);
    NEED(K_ARCH);
    *arch = (unsigned)G->v[K_ARCH];
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEV_ENTER("nvmlDeviceGetCudaComputeCapability");
    NONNULL(major && minor);
    if (!G->has_cc) RET(NVML_ERROR_NOT_SUPPORTED);
    *major = G->cc_major;
    *minor = G->cc_minor;
    RET(NVML_SUCCESS);
}

static nvmlReturn_t pci_info(const char *sym, nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER(sym);
    NONNULL(pci);
    if (!G->has_pci) RET(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, G->domain & 0xffff, G->bus,
             G->dev);
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, G->domain, G->bus, G->dev);
    pci->domain = G->domain;
    pci->bus = G->bus;
    pci->device = G->dev;
    pci->pciDeviceId = (unsigned)G->v[K_PCI_DEVICE_ID];
    pci->pciSubSystemId = (unsigned)G->v[K_PCI_SUBSYSTEM_ID];
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci_info("nvmlDeviceGetPciInfo", d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) {
    return pci_info("nvmlDeviceGetPciInfo_v2", d, p);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    return pci_info("nvmlDeviceGetPciInfo_v3", d, p);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* thermal, power, utilisation, memory */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp) {
    DEV_ENTER("nvmlDeviceGetTemperature");
    NONNULL(temp);
    if (sensorType != 0) RET(NVML_ERROR_INVALID_ARGUMENT); /* NVML_TEMPERATURE_GPU is the only sensor */
    NEED(K_TEMP);
    *temp = (unsigned)G->v[K_TEMP];
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, unsigned int type, unsigned int *temp) {
    DEV_ENTER("nvmlDeviceGetTemperatureThreshold");
    NONNULL(temp);
    /* nvmlTemperatureThresholds_t: SHUTDOWN 0, SLOWDOWN 1, MEM_MAX 2, GPU_MAX 3, then ACOUSTIC_MIN..GPS_CURR up to 7 */
    static const int keys[4] = {K_SHUTDOWN, K_SLOWDOWN, K_MEM_MAX, K_GPU_MAX};
    if (type >= 8) RET(NVML_ERROR_INVALID_ARGUMENT);
    if (type >= 4) RET(NVML_ERROR_NOT_SUPPORTED);
    NEED(keys[type]);
    *temp = (unsigned)G->v[keys[type]];
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEV_ENTER("nvmlDeviceGetPowerUsage");
    NONNULL(power);
    NEED(K_POWER);
    *power = (unsigned)G->v[K_POWER];
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER("nvmlDeviceGetEnforcedPowerLimit");
    NONNULL(limit);
    NEED(K_POWER_LIMIT);
    *limit = (unsigned)G->v[K_POWER_LIMIT];
    RET(NVML_SUCCESS);
}

/* nvml.h: "the power management limit that the device boots with", in milliwatts. */
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit) {
    DEV_ENTER("nvmlDeviceGetPowerManagementDefaultLimit");
    NONNULL(limit);
    NEED(K_POWER_DEFAULT);
    *limit = (unsigned)G->v[K_POWER_DEFAULT];
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    DEV_ENTER("nvmlDeviceGetUtilizationRates");
    NONNULL(u);
    if (!G->has[K_UTIL_GPU] && !G->has[K_UTIL_MEM]) RET(NVML_ERROR_NOT_SUPPORTED);
    /* nvml.h (13.0): "On MIG-enabled GPUs, querying device utilization rates is not currently supported"; seen on
     * 470 (XuehaiPan/nvitop issue #5) and 535 (utkuozdemir/nvidia_gpu_exporter issue #203) */
    if (G->v[K_MIG_CUR]) RET(NVML_ERROR_NOT_SUPPORTED);
    u->gpu = (unsigned)G->v[K_UTIL_GPU];
    u->memory = (unsigned)G->v[K_UTIL_MEM];
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo");
    NONNULL(m);
    NEED(K_MEM_TOTAL);
    m->total = G->v[K_MEM_TOTAL];
    m->used = G->v[K_MEM_USED]; /* v1: used includes the reserved memory */
    m->free = m->total > m->used ? m->total - m->used : 0;
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo_v2");
    NONNULL(m);
    if (m->version != nvmlMemory_v2) RET(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    NEED(K_MEM_TOTAL);
    unsigned long long used = G->v[K_MEM_USED], reserved = G->v[K_MEM_RESERVED];
    m->total = G->v[K_MEM_TOTAL];
    m->reserved = reserved;
    m->used = used > reserved ? used - reserved : 0; /* v2: allocated only */
    m->free = m->total > used ? m->total - used : 0;
    RET(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* ECC, retired pages, row remapping */

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    DEV_ENTER("nvmlDeviceGetEccMode");
    NONNULL(current && pending);
    NEED(K_ECC_CUR);
    *current = (unsigned)G->v[K_ECC_CUR];
    *pending = G->has[K_ECC_PEND] ? (unsigned)G->v[K_ECC_PEND] : *current;
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType, unsigned int counterType,
                                         unsigned long long *count) {
    DEV_ENTER("nvmlDeviceGetTotalEccErrors");
    NONNULL(count);
    /* nvmlMemoryErrorType_t CORRECTED 0 / UNCORRECTED 1; nvmlEccCounterType_t VOLATILE 0 / AGGREGATE 1 */
    if (errorType > 1 || counterType > 1) RET(NVML_ERROR_INVALID_ARGUMENT);
    static const int keys[2][2] = {{K_ECC_VOL_C, K_ECC_AGG_C}, {K_ECC_VOL_U, K_ECC_AGG_U}};
    int k = keys[errorType][counterType];
    NEED(k);
    *count = G->v[k];
    RET(NVML_SUCCESS);
}

static unsigned long long page_address(int gpu, unsigned cause, unsigned i) {
    return 0x100000000ULL * (unsigned)(gpu + 1) + 0x10000000ULL * cause + 0x1000ULL * i; /* synthetic, distinct */
}

static nvmlReturn_t retired_pages(const char *sym, nvmlDevice_t device, unsigned int cause, unsigned int *count,
                                  unsigned long long *addresses, unsigned long long *timestamps, int v2) {
    DEV_ENTER(sym);
    NONNULL(count);
    /* nvmlPageRetirementCause_t: MULTIPLE_SINGLE_BIT_ECC_ERRORS 0 (sbe), DOUBLE_BIT_ECC_ERROR 1 (dbe) */
    if (cause > 1) RET(NVML_ERROR_INVALID_ARGUMENT);
    int k = cause == 0 ? K_RET_SBE : K_RET_DBE;
    NEED(k);
    unsigned n = (unsigned)G->v[k];
    if (*count < n || (n && !addresses)) {
        *count = n;
        RET(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    for (unsigned i = 0; i < n; i++) {
        addresses[i] = page_address(gi_, cause, i);
        if (v2 && timestamps) timestamps[i] = 1700000000ULL + i;
    }
    *count = n;
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, unsigned int cause, unsigned int *n, unsigned long long *a) {
    return retired_pages("nvmlDeviceGetRetiredPages", d, cause, n, a, NULL, 0);
}
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, unsigned int cause, unsigned int *n, unsigned long long *a,
                                          unsigned long long *t) {
    return retired_pages("nvmlDeviceGetRetiredPages_v2", d, cause, n, a, t, 1);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *pending) {
    DEV_ENTER("nvmlDeviceGetRetiredPagesPendingStatus");
    NONNULL(pending);
    NEED(K_RET_PEND);
    *pending = (unsigned)G->v[K_RET_PEND];
    RET(NVML_SUCCESS);
}

static int has_remap(const struct gpu *g) {
    return g->has[K_REMAP_C] || g->has[K_REMAP_U] || g->has[K_REMAP_P] || g->has[K_REMAP_F];
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    DEV_ENTER("nvmlDeviceGetRemappedRows");
    NONNULL(corr && unc && pending && failure);
    /* the driver answers NOT_SUPPORTED for row remapping while MIG mode is enabled */
    if (!has_remap(G) || G->v[K_MIG_CUR] == 1) RET(NVML_ERROR_NOT_SUPPORTED);
    *corr = (unsigned)G->v[K_REMAP_C];
    *unc = (unsigned)G->v[K_REMAP_U];
    *pending = (unsigned)G->v[K_REMAP_P];
    *failure = (unsigned)G->v[K_REMAP_F];
    RET(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* PCIe and NVLink */

static nvmlReturn_t pcie(const char *sym, nvmlDevice_t device, unsigned int *out, int key) {
    DEV_ENTER(sym);
    NONNULL(out);
    NEED(key);
    *out = (unsigned)G->v[key];
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) {
    return pcie("nvmlDeviceGetCurrPcieLinkGeneration", d, v, K_PCIE_GEN);
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) {
    return pcie("nvmlDeviceGetMaxPcieLinkGeneration", d, v, K_PCIE_MAX_GEN);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v) {
    return pcie("nvmlDeviceGetCurrPcieLinkWidth", d, v, K_PCIE_W);
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v) {
    return pcie("nvmlDeviceGetMaxPcieLinkWidth", d, v, K_PCIE_MAX_W);
}

static unsigned links(const struct gpu *g) {
    unsigned n = (unsigned)g->v[K_NVL_LINKS];
    return n > FAKE_NVLINK_MAX_LINKS ? FAKE_NVLINK_MAX_LINKS : n;
}

static int counters_supported(const struct gpu *g) { return !g->has[K_NVL_COUNTERS] || g->v[K_NVL_COUNTERS] != 0; }

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active) {
    DEV_ENTER("nvmlDeviceGetNvLinkState");
    NONNULL(active);
    NEED(K_NVL_LINKS);
    /* Past the header's NVML_NVLINK_MAX_LINKS the link is invalid; at or past this GPU's own link count a real A100
     * answers NOT_SUPPORTED (leptonai/gpud pkg/nvidia-query/nvml/nvlink.go loops to NVLINK_MAX_LINKS and stops
     * there on NOT_SUPPORTED) */
    if (link >= FAKE_NVLINK_MAX_LINKS) RET(NVML_ERROR_INVALID_ARGUMENT);
    if (link >= links(G)) RET(NVML_ERROR_NOT_SUPPORTED);
    *active = (G->nvl_down >> link) & 1 ? 0 : 1;
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, unsigned int counter,
                                             unsigned long long *value) {
    DEV_ENTER("nvmlDeviceGetNvLinkErrorCounter");
    NONNULL(value);
    NEED(K_NVL_LINKS);
    if (link >= links(G)) RET(NVML_ERROR_INVALID_ARGUMENT);
    /* nvmlNvLinkErrorCounter_t: DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2, DL_CRC_DATA 3, DL_ECC_DATA 4 */
    if (counter > 4) RET(NVML_ERROR_INVALID_ARGUMENT);
    if (!counters_supported(G)) RET(NVML_ERROR_NOT_SUPPORTED);
    *value = counter < 4 ? G->nvl[link][counter] : 0;
    RET(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* fabric */

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    DEV_ENTER("nvmlDeviceGetGpuFabricInfo");
    NONNULL(info);
    NEED(K_FAB_STATE);
    memset(info, 0, sizeof *info);
    info->status = (nvmlReturn_t)G->v[K_FAB_STATUS];
    info->cliqueId = (unsigned)G->v[K_FAB_CLIQUE];
    info->state = (nvmlGpuFabricState_t)G->v[K_FAB_STATE];
    RET(NVML_SUCCESS);
}

/* nvmlDeviceGetGpuFabricInfoV: first in the 12.4 header (550); v2 structs up to 12.8 (570), v2 and v3 in 13.0 */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfo_v3_t *info) {
    DEV_ENTER("nvmlDeviceGetGpuFabricInfoV");
    NONNULL(info);
    unsigned version = info->version;
    int v3 = NVML_BRANCH >= 580 && version == nvmlGpuFabricInfo_v3;
    if (version != nvmlGpuFabricInfo_v2 && !v3) RET(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    NEED(K_FAB_STATE);
    /* v2 is a prefix of v3: fill the v2 part, then healthSummary for v3 */
    memset(info, 0, v3 ? sizeof(nvmlGpuFabricInfo_v3_t) : sizeof(nvmlGpuFabricInfo_v2_t));
    info->version = version;
    info->status = (nvmlReturn_t)G->v[K_FAB_STATUS];
    info->cliqueId = (unsigned)G->v[K_FAB_CLIQUE];
    info->state = (nvmlGpuFabricState_t)G->v[K_FAB_STATE];
    info->healthMask = (unsigned)G->v[K_FAB_HMASK];
    if (v3) info->healthSummary = (unsigned char)G->v[K_FAB_HSUM];
    RET(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* processes: the two-call protocol (count first, INSUFFICIENT_SIZE, then a buffer) */

static nvmlReturn_t processes(const char *sym, nvmlDevice_t device, unsigned int *count, void *infos, int v1) {
    DEV_ENTER(sym);
    NONNULL(count);
    if (!G->has_procs) RET(NVML_ERROR_NOT_SUPPORTED);
    unsigned n = (unsigned)G->nprocs;
    if (*count < n || (n && !infos)) {
        *count = n;
        RET(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    int mig = G->v[K_MIG_CUR] == 1;
    for (unsigned i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = G->procs[i].pid;
            p->usedGpuMemory = G->procs[i].bytes;
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            p->pid = G->procs[i].pid;
            p->usedGpuMemory = G->procs[i].bytes;
            p->gpuInstanceId = mig ? 0 : 0xFFFFFFFFu; /* 0xFFFFFFFF without MIG, per the header */
            p->computeInstanceId = mig ? 0 : 0xFFFFFFFFu;
        }
    }
    *count = n;
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v1_t *p) {
    return processes("nvmlDeviceGetComputeRunningProcesses", d, n, p, 1);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v2_t *p) {
    return processes("nvmlDeviceGetComputeRunningProcesses_v2", d, n, p, 0);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v2_t *p) {
    return processes("nvmlDeviceGetComputeRunningProcesses_v3", d, n, p, 0);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* clocks, persistence, MIG */

static nvmlReturn_t reasons(const char *sym, nvmlDevice_t device, unsigned long long *out) {
    DEV_ENTER(sym);
    NONNULL(out);
    NEED(K_THROTTLE);
    *out = G->v[K_THROTTLE]; /* nvmlClocksThrottleReason* == nvmlClocksEventReason* bit for bit */
    RET(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    return reasons("nvmlDeviceGetCurrentClocksThrottleReasons", d, r);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) {
    return reasons("nvmlDeviceGetCurrentClocksEventReasons", d, r);
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    DEV_ENTER("nvmlDeviceGetPersistenceMode");
    NONNULL(mode);
    NEED(K_PERSIST);
    *mode = (unsigned)G->v[K_PERSIST];
    RET(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    DEV_ENTER("nvmlDeviceGetMigMode");
    NONNULL(current && pending);
    NEED(K_MIG_CUR);
    *current = (unsigned)G->v[K_MIG_CUR];
    *pending = G->has[K_MIG_PEND] ? (unsigned)G->v[K_MIG_PEND] : *current;
    RET(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* field values */

#define FI_ECC_SBE_VOL 3
#define FI_ECC_DBE_VOL 4
#define FI_ECC_SBE_AGG 5
#define FI_ECC_DBE_AGG 6
#define FI_RETIRED_SBE 29
#define FI_RETIRED_DBE 30
#define FI_RETIRED_PENDING 31
#define FI_MEMORY_TEMP 82
#define FI_NVLINK_LINK_COUNT 91
#define FI_REMAPPED_COR 142
#define FI_REMAPPED_UNC 143
#define FI_REMAPPED_PENDING 144
#define FI_REMAPPED_FAILURE 145
#define FI_NVLINK_DL_REPLAY 161
#define FI_NVLINK_DL_RECOVERY 162
#define FI_NVLINK_DL_CRC 163
#define FI_NVLINK_GET_STATE 165 /* NVML_NVLINK_STATE_INACTIVE 0 / ACTIVE 1 / SLEEP 2 */
#define FI_GPU_RECOVERY_ACTION 230
#define FI_PERF_POLICY_POWER 74 /* NVML_FI_DEV_PERF_POLICY_POWER ... _RELIABILITY 79: ns throttled, every branch */
#define FI_PERF_POLICY_RELIABILITY 79
#define FI_HW_THERM_SLOWDOWN 252 /* NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: 13.0 header (580) only */
#define FI_HW_POWER_BRAKE_SLOWDOWN 253

/* The legacy per-link counters (links 0-5 and 6-11, no scopeId), first in the 11.x headers:
 * what a driver before 525, which lacks the scoped NVLINK_ERROR_DL_* fields, answers. Returns
 * the link and the counter (0 replay, 1 recovery, 2 CRC flit, 3 CRC data), or -1. */
static int legacy_link_field(unsigned id, int *counter) {
    static const unsigned lo[4] = {46, 53, 32, 39}, hi[4] = {108, 114, 96, 102};
    for (int c = 0; c < 4; c++) {
        if (id >= lo[c] && id < lo[c] + 6) { *counter = c; return (int)(id - lo[c]); }
        if (id >= hi[c] && id < hi[c] + 6) { *counter = c; return (int)(id - hi[c]) + 6; }
    }
    return -1;
}

static nvmlReturn_t field_value(const struct gpu *g, int gi, nvmlFieldValue_t *f) {
    unsigned id = f->fieldId;
    int key = -1, ull = 0, counter = 0;
    if (id >= FAKE_FI_MAX) return NVML_ERROR_INVALID_ARGUMENT; /* beyond this branch's NVML_FI_MAX */
    for (int i = 0; i < S.nrules; i++) { /* field_error: this one value fails, the call does not */
        const struct rule *r = &S.rules[i];
        if (r->kind == R_FIELD && r->field == id && (r->gpu < 0 || r->gpu == gi)) return (nvmlReturn_t)r->arg;
    }
    int legacy = legacy_link_field(id, &counter);
    if (legacy >= 0) {
        if (!g->has[K_NVL_LINKS]) return NVML_ERROR_NOT_SUPPORTED;
        if ((unsigned)legacy >= links(g)) return NVML_ERROR_INVALID_ARGUMENT;
        if (!counters_supported(g)) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        f->value.ullVal = g->nvl[legacy][counter];
        return NVML_SUCCESS;
    }
    switch (id) {
    case FI_ECC_SBE_VOL: key = K_ECC_VOL_C, ull = 1; break;
    case FI_ECC_DBE_VOL: key = K_ECC_VOL_U, ull = 1; break;
    case FI_ECC_SBE_AGG: key = K_ECC_AGG_C, ull = 1; break;
    case FI_ECC_DBE_AGG: key = K_ECC_AGG_U, ull = 1; break;
    case FI_RETIRED_SBE: key = K_RET_SBE, ull = 1; break;
    case FI_RETIRED_DBE: key = K_RET_DBE, ull = 1; break;
    case FI_RETIRED_PENDING: key = K_RET_PEND; break;
    case FI_MEMORY_TEMP: key = K_MEM_TEMP; break;
    case FI_NVLINK_LINK_COUNT: key = K_NVL_LINKS; break;
    case FI_REMAPPED_COR:
    case FI_REMAPPED_UNC:
    case FI_REMAPPED_PENDING:
    case FI_REMAPPED_FAILURE: {
        static const int rk[4] = {K_REMAP_C, K_REMAP_U, K_REMAP_P, K_REMAP_F};
        if (!has_remap(g) || g->v[K_MIG_CUR] == 1) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        f->value.uiVal = (unsigned)g->v[rk[id - FI_REMAPPED_COR]];
        return NVML_SUCCESS;
    }
    case FI_NVLINK_DL_REPLAY:
    case FI_NVLINK_DL_RECOVERY:
    case FI_NVLINK_DL_CRC:
    case FI_NVLINK_GET_STATE: {
        if (!g->has[K_NVL_LINKS]) return NVML_ERROR_NOT_SUPPORTED;
        unsigned link = f->scopeId;
        if (link >= links(g)) return NVML_ERROR_INVALID_ARGUMENT;
        if (id == FI_NVLINK_GET_STATE) {
            f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            f->value.uiVal = (g->nvl_down >> link) & 1 ? 0 : 1;
            return NVML_SUCCESS;
        }
        if (!counters_supported(g)) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        f->value.ullVal = id == FI_NVLINK_DL_REPLAY     ? g->nvl[link][0]
                          : id == FI_NVLINK_DL_RECOVERY ? g->nvl[link][1]
                                                        : g->nvl[link][2] + g->nvl[link][3];
        return NVML_SUCCESS;
    }
    case FI_GPU_RECOVERY_ACTION: key = K_RECOVERY; break;
    case FI_PERF_POLICY_POWER:
    case FI_PERF_POLICY_POWER + 1:
    case FI_PERF_POLICY_POWER + 2:
    case FI_PERF_POLICY_POWER + 3:
    case FI_PERF_POLICY_POWER + 4:
    case FI_PERF_POLICY_RELIABILITY: key = K_THR_POWER + (int)(id - FI_PERF_POLICY_POWER), ull = 1; break;
#if NVML_BRANCH >= 580 /* in the 12.8 header (570) 252/253 are power-smoothing fields: not simulated there */
    case FI_HW_THERM_SLOWDOWN: key = K_THR_HW_THERMAL, ull = 1; break;
    case FI_HW_POWER_BRAKE_SLOWDOWN: key = K_THR_HW_POWER_BRAKE, ull = 1; break;
#endif
    default: return NVML_ERROR_NOT_SUPPORTED; /* a field this branch knows but the fake does not simulate */
    }
    if (!g->has[key]) return NVML_ERROR_NOT_SUPPORTED;
    if (ull) {
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        f->value.ullVal = g->v[key];
    } else {
        f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        f->value.uiVal = (unsigned)g->v[key];
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    struct call c_;
    int gi_ = dev_index(device);
    call_start(&c_, "nvmlDeviceGetFieldValues", gi_);
    c_.nvals = valuesCount;
    apply_timing(&c_);
    if (!initialised()) RET(NVML_ERROR_UNINITIALIZED);
    if (gi_ < 0) RET(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t e = injected(&c_);
    if (e) RET(e);
    const struct gpu *G = &S.gpu[gi_];
    if (unsupported(G, &c_)) RET(NVML_ERROR_NOT_SUPPORTED);
    if (valuesCount < 0 || (valuesCount > 0 && !values)) RET(NVML_ERROR_INVALID_ARGUMENT);
    long long ts = now_us(CLOCK_REALTIME);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *f = &values[i];
        f->timestamp = ts;
        f->latencyUsec = 0;
        f->nvmlReturn = field_value(G, gi_, f);
    }
    RET(NVML_SUCCESS);
}
