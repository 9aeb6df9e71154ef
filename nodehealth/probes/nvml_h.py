"""What nvml.h and nvidia-ml-py define that the NVML probe relies on, by value.

The probe keeps its own copy of every constant, field id and structure it uses: the installed
nvidia-ml-py may be older or newer than the driver, and a constant an older wheel lacks must
never become a crash (docs/nvml.md). Pure data and ctypes layouts; no call is made here.
"""

from __future__ import annotations

import ctypes

# Every pynvml function this probe calls (first choice, then what it falls back to).
NVML_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetComputeRunningProcesses_v3",  # called through pynvml's library (processes)
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetFieldValues",
    # Only where the driver predates the per-link NVLink fields (drivers before 525):
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
)
NVML_CLASSES = ("NVMLError",)

# nvmlReturn_t (nvml.h). The probe keeps its own table: the installed nvidia-ml-py may be
# older or newer than the driver, and a missing constant must never become a crash.
RETURN_CODES = {
    0: "success",
    1: "uninitialized",
    2: "invalid_argument",
    3: "not_supported",
    4: "no_permission",
    5: "already_initialized",
    6: "not_found",
    7: "insufficient_size",
    8: "insufficient_power",
    9: "driver_not_loaded",
    10: "timeout",
    11: "irq_issue",
    12: "library_not_found",
    13: "function_not_found",
    14: "corrupted_inforom",
    15: "gpu_lost",
    16: "reset_required",
    17: "operating_system",
    18: "version_mismatch",
    19: "in_use",
    20: "memory",
    21: "no_data",
    22: "vgpu_ecc_not_supported",
    23: "insufficient_resources",
    24: "freq_not_supported",
    25: "argument_version_mismatch",
    26: "deprecated",
    27: "not_ready",
    28: "gpu_not_found",
    29: "invalid_state",
    30: "reset_type_not_supported",
    999: "unknown",
}  # complete up to the nvml.h of CUDA 13.3 (go-nvml 8b8585b): 30 is the last before 999
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, FUNCTION_NOT_FOUND, GPU_IS_LOST = 0, 2, 3, 13, 15
ARGUMENT_VERSION_MISMATCH = 25


# A call that answered one of these does not apply to this GPU or driver: the field is None.
NOT_APPLICABLE = frozenset({"not_supported", "function_not_found", "library_mismatch"})

# nvml.h constants by value (pynvml's names; the oldest wheels lack some of them).
TEMPERATURE_GPU = 0
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN, THRESHOLD_MEM_MAX, THRESHOLD_GPU_MAX = 0, 1, 2, 3
FEATURE_ENABLED = 1


# NVML_NVLINK_MAX_LINKS: 12 up to CUDA 11.8, 18 from 12.0 to 13.2, 36 in the CUDA 13.3 nvml.h. The link
# count itself is NVML_FI_DEV_NVLINK_LINK_COUNT; this only bounds it, at the newest header's value.
NVLINK_MAX_LINKS = 36
NVLINK_ERROR_DL_REPLAY, NVLINK_ERROR_DL_RECOVERY, NVLINK_ERROR_DL_CRC_FLIT, NVLINK_ERROR_DL_CRC_DATA = 0, 1, 2, 3


# Field ids (NVML_FI_DEV_*, nvml.h). One nvmlDeviceGetFieldValues call reads them all.
FI_ECC_SBE_VOL_TOTAL, FI_ECC_DBE_VOL_TOTAL, FI_ECC_SBE_AGG_TOTAL, FI_ECC_DBE_AGG_TOTAL = 3, 4, 5, 6
FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING = 29, 30, 31
FI_MEMORY_TEMP = 82
FI_NVLINK_LINK_COUNT = 91
FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE = 142, 143, 144, 145


# Per link, with scopeId = link (CUDA 12.0 / driver 525 and later):
FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC = 161, 162, 163
FI_NVLINK_GET_STATE = 165
FI_GET_GPU_RECOVERY_ACTION = 230  # drivers 570 and later; nvidia-ml-py from 12.570.86
# Time throttled per reason, in ns, since the driver loaded: NVML_FI_DEV_PERF_POLICY_* (74-79, in every
# branch's nvml.h since 11.4; 13.0 calls 74 "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP ... in ns" and
# deprecates nvmlDeviceGetViolationStatus for them). Read in the one field-values call: no call of their own.
THROTTLE_FIELDS = (
    (74, "power"),
    (75, "thermal"),
    (76, "sync_boost"),
    (77, "board_limit"),
    (78, "low_utilization"),
    (79, "reliability"),
)
# NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN / _HW_POWER_BRAKE_SLOWDOWN (ns), first in the 13.0 header
# (driver 580). Asked only of drivers from THROTTLE_FIELDS_580_FROM: in the 12.8 header (570) the same ids are
# NVML_FI_PWR_SMOOTHING_PRIV_LVL and _IMM_RAMP_DOWN_ENABLED, which a 570 driver would answer.
THROTTLE_FIELDS_580 = ((252, "hw_thermal"), (253, "hw_power_brake"))
THROTTLE_FIELDS_580_FROM = 580
GPU_FIELDS = (
    FI_ECC_SBE_VOL_TOTAL,
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_AGG_TOTAL,
    FI_ECC_DBE_AGG_TOTAL,
    FI_RETIRED_SBE,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_MEMORY_TEMP,
    FI_NVLINK_LINK_COUNT,
    FI_REMAPPED_COR,
    FI_REMAPPED_UNC,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_FAILURE,
    FI_GET_GPU_RECOVERY_ACTION,
    *(fid for fid, _ in THROTTLE_FIELDS),
)
LINK_FIELDS = (FI_NVLINK_GET_STATE, FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC)


# Before 525: per-link counter ids, links 0-5 then 6-11 (NVML_FI_DEV_NVLINK_{REPLAY,RECOVERY,


# CRC_FLIT,CRC_DATA}_ERROR_COUNT_L<n>, nvml.h of CUDA 11.4), no scope.
LEGACY_MAX_LINKS = 12
LEGACY_BASES = ((46, 108), (53, 114), (32, 96), (39, 102))  # replay, recovery, crc flit, crc data


def legacy_link_fields(link: int) -> tuple[int, ...]:
    return tuple(low + link if link < 6 else high + link - 6 for low, high in LEGACY_BASES)


# Which observation a field feeds (for the errors a check reads).
FIELD_GROUP = {
    FI_ECC_SBE_VOL_TOTAL: "ecc_errors",
    FI_ECC_DBE_VOL_TOTAL: "ecc_errors",
    FI_ECC_SBE_AGG_TOTAL: "ecc_errors",
    FI_ECC_DBE_AGG_TOTAL: "ecc_errors",
    FI_RETIRED_SBE: "retired_pages",
    FI_RETIRED_DBE: "retired_pages",
    FI_RETIRED_PENDING: "retired_pages",
    FI_MEMORY_TEMP: "temperature",
    FI_NVLINK_LINK_COUNT: "nvlink",
    FI_REMAPPED_COR: "remapped_rows",
    FI_REMAPPED_UNC: "remapped_rows",
    FI_REMAPPED_PENDING: "remapped_rows",
    FI_REMAPPED_FAILURE: "remapped_rows",
    FI_GET_GPU_RECOVERY_ACTION: "recovery_action",
    **{fid: "throttle_time" for fid, _ in THROTTLE_FIELDS + THROTTLE_FIELDS_580},
    FI_NVLINK_GET_STATE: "nvlink",
    FI_NVLINK_ERROR_DL_REPLAY: "nvlink",
    FI_NVLINK_ERROR_DL_RECOVERY: "nvlink",
    FI_NVLINK_ERROR_DL_CRC: "nvlink",
    **{low + n: "nvlink" for low, high in LEGACY_BASES for n in range(6)},
    **{high + n: "nvlink" for low, high in LEGACY_BASES for n in range(6)},
}


class FabricInfoV1(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvml.h lays it out: the state is one byte at offset 24.

    nvidia-ml-py before 13.615.71 declares an 80-byte clusterUuid (state read at offset 88,
    always 0 = "not supported"), so the probe passes its own structure.
    """

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),  # noqa: RUF012
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


class FabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t (nvml.h): version 0x02000024, health mask, no summary."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),  # noqa: RUF012
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
    ]


class FabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t (nvml.h): v2 and the health summary after it (version 0x3000028)."""

    _fields_ = [*FabricInfoV2._fields_, ("healthSummary", ctypes.c_ubyte)]  # noqa: RUF012


FABRIC_VERSIONS = ((FabricInfoV3, 0x3000028), (FabricInfoV2, 0x02000024))


class ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t (nvml.h), what nvmlDeviceGetComputeRunningProcesses_v2 fills."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),  # noqa: RUF012
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]
