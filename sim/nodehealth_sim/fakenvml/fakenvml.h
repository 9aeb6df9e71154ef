/*
 * fakenvml: the NVML types the fake libnvidia-ml.so.1 needs, declared here with the C layouts of NVIDIA's nvml.h
 * (github.com/NVIDIA/go-nvml gen/nvml/nvml.h; the commits per branch are cited in symbols.tsv). nvml.h itself is
 * neither vendored nor included: only what the fake answers is declared, and the _Static_asserts below pin every
 * layout a caller (pynvml's ctypes structures) reads.
 */
#ifndef FAKENVML_H
#define FAKENVML_H

#include <stddef.h>

#ifndef NVML_BRANCH
#error "build with -DNVML_BRANCH=<470|525|535|550|570|580>"
#endif

typedef int nvmlReturn_t; /* enum nvmlReturn_enum: an int-sized enum in every header */

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25 /* first in the 12.0 header (525) */
#define NVML_ERROR_UNKNOWN 999

/* nvmlDevice_t is `typedef struct nvmlDevice_st* nvmlDevice_t;` in gen/nvml/nvml.h of every branch. */
struct nvmlDevice_st {
    int index;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef unsigned int nvmlEnableState_t; /* NVML_FEATURE_DISABLED 0 / NVML_FEATURE_ENABLED 1 */

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT "%04X:%02X:%02X.0"
#define NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0"

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used; /* reserved + allocated */
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used; /* allocated only */
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2U << 24)))

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* _v2 and _v3 both take this layout: `} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;` (12.2+ headers); the 11.4 and
 * 12.0 headers spell nvmlProcessInfo_t out with the same four members. */
typedef struct nvmlProcessInfo_v2_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef union nvmlValue_st {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType; /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

#define NVML_GPU_FABRIC_UUID_LEN 16
typedef unsigned char nvmlGpuFabricState_t;

typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId; /* "partitionId" in the 12.0 header, same place */
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

#define nvmlGpuFabricInfo_v2 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2U << 24)))
#define nvmlGpuFabricInfo_v3 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v3_t) | (3U << 24)))

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40 && nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlFieldValue_t) == 40 && offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28 && offsetof(nvmlGpuFabricInfo_t, state) == 24, "fabric v1");
_Static_assert(nvmlGpuFabricInfo_v2 == 0x02000024, "fabric v2");
_Static_assert(nvmlGpuFabricInfo_v3 == 0x03000028 && offsetof(nvmlGpuFabricInfo_v3_t, healthSummary) == 36,
               "fabric v3");

/* Per-branch constants from that branch's header (see docs/fake-nvml.md for the table). */
#if NVML_BRANCH == 470
#define FAKE_FI_MAX 161 /* NVML_FI_MAX, CUDA 11.4 header */
#define FAKE_NVLINK_MAX_LINKS 12
#define FAKE_NVML_MAJOR 11
#define FAKE_CUDA_DEFAULT 11040
#elif NVML_BRANCH == 525
#define FAKE_FI_MAX 170
#define FAKE_NVLINK_MAX_LINKS 18
#define FAKE_NVML_MAJOR 12
#define FAKE_CUDA_DEFAULT 12000
#elif NVML_BRANCH == 535
#define FAKE_FI_MAX 197
#define FAKE_NVLINK_MAX_LINKS 18
#define FAKE_NVML_MAJOR 12
#define FAKE_CUDA_DEFAULT 12020
#elif NVML_BRANCH == 550
#define FAKE_FI_MAX 200
#define FAKE_NVLINK_MAX_LINKS 18
#define FAKE_NVML_MAJOR 12
#define FAKE_CUDA_DEFAULT 12040
#elif NVML_BRANCH == 570
#define FAKE_FI_MAX 269
#define FAKE_NVLINK_MAX_LINKS 18
#define FAKE_NVML_MAJOR 12
#define FAKE_CUDA_DEFAULT 12080
#elif NVML_BRANCH == 580
#define FAKE_FI_MAX 274
#define FAKE_NVLINK_MAX_LINKS 18
#define FAKE_NVML_MAJOR 13
#define FAKE_CUDA_DEFAULT 13000
#else
#error "unknown NVML_BRANCH"
#endif

#endif
