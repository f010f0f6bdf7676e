/* libcuda.so.1 (lab stand-in): the CUDA driver API entry points a CUDA init check calls, and the ones
 * sgl-kernel 0.3.21's common_ops library links (`nm -D --undefined-only`): without them the real engine's
 * `import sgl_kernel` fails with "undefined symbol: cuMemAddressFree", as it would against a driver too old to
 * have them, not as it does on a GPU host. With no GPU behind them they answer as the real library does before
 * cuInit (CUDA_ERROR_NOT_INITIALIZED) or without a context (CUDA_ERROR_INVALID_CONTEXT).
 *
 * cuInit succeeds only when the caller's /dev has nvidiactl and nvidia-uvm AND the host's live
 * nvidia_uvm parameter uvm_disable_hmm reads Y (or 1); otherwise it returns 3,
 * CUDA_ERROR_NOT_INITIALIZED: the failure the story's host had inside its LXC container until HMM
 * was disabled on the host (docs/story.md, CUDA inside the container; NVIDIA/open-gpu-kernel-modules#797, #901, #947).
 * The parameter is read where a container sees it (bound in by pct) or where the host keeps it.
 * Compiled on the controller by toolkit/lab/system.py; no GPU, no driver behind it.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <stdlib.h>

#ifndef LAB_DRIVER_VERSION
#define LAB_DRIVER_VERSION "580.95.05"
#endif

typedef int CUresult;
typedef int CUdevice;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
};

/* The host's stand-in nvidia module, as a container sees it (bound in by pct) or the host keeps it. */
static const char *module_dirs[] = {
    "/var/lib/lab-standin/host-sys-module/nvidia",
    "/run/lab-standin/sys/module/nvidia",
};

static int read_module_file(const char *name, char *buf, size_t n) {
    for (size_t i = 0; i < sizeof module_dirs / sizeof module_dirs[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", module_dirs[i], name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t got = fread(buf, 1, n - 1, f);
        fclose(f);
        buf[got] = 0;
        char *nl = strchr(buf, '\n');
        if (nl) *nl = 0;
        return 1;
    }
    buf[0] = 0;
    return 0;
}

static int initialised = 0;
static int device_count = 0;
const char lab_standin_banner[] = "libcuda.so.1 lab stand-in, driver " LAB_DRIVER_VERSION;

static const char *hmm_paths[] = {
    "/var/lib/lab-standin/host-sys-module/nvidia_uvm/parameters/uvm_disable_hmm",
    "/run/lab-standin/sys/module/nvidia_uvm/parameters/uvm_disable_hmm",
};

static int present(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

static int hmm_disabled(char *seen, size_t n) {
    for (size_t i = 0; i < sizeof hmm_paths / sizeof hmm_paths[0]; i++) {
        FILE *f = fopen(hmm_paths[i], "r");
        if (!f) continue;
        char buf[8] = {0};
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = 0;
        snprintf(seen, n, "%s=%c", hmm_paths[i], buf[0] ? buf[0] : '?');
        return buf[0] == 'Y' || buf[0] == 'y' || buf[0] == '1';
    }
    snprintf(seen, n, "nvidia_uvm not loaded on the host");
    return 0;
}

/* The GPUs CUDA sees: the /dev/nvidiaN nodes the caller has whose minor is one the driver drives (a node
 * for a GPU passed to a VM, or one the module did not take, opens nothing). */
static int count_gpus(void) {
    char bound[16];
    int limit = read_module_file("gpu_count", bound, sizeof bound) ? atoi(bound) : 1 << 30;
    DIR *d = opendir("/dev");
    if (!d) return 0;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "nvidia", 6) == 0 && e->d_name[6] >= '0' && e->d_name[6] <= '9'
            && atoi(e->d_name + 6) < limit) count++;
    }
    closedir(d);
    return count;
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    char seen[256];
    int ctl = present("/dev/nvidiactl"), uvm = present("/dev/nvidia-uvm");
    int hmm = hmm_disabled(seen, sizeof seen);
    CUresult rc = (ctl && uvm && hmm) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    char kmod[64], nvswitches[16], fabric[32];
    /* A userspace of another version than the loaded module (an upgrade without reboot): 803, and
     * on an NVSwitch system with no Fabric Manager having trained the fabric: 802. */
    if (read_module_file("version", kmod, sizeof kmod) && strcmp(kmod, LAB_DRIVER_VERSION) != 0) {
        rc = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), ", kernel module %s, library %s", kmod,
                 LAB_DRIVER_VERSION);
    } else if (rc == CUDA_SUCCESS && read_module_file("nvswitches", nvswitches, sizeof nvswitches)
               && atoi(nvswitches) > 0
               && !(read_module_file("fabric_state", fabric, sizeof fabric) && strcmp(fabric, "completed") == 0)) {
        rc = CUDA_ERROR_SYSTEM_NOT_READY;
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), ", %s NVSwitches, fabric not trained", nvswitches);
    }
    if (getenv("LAB_STANDIN_QUIET") == NULL)
        fprintf(stderr, "libcuda.so.1 (lab stand-in): cuInit -> %d (/dev/nvidiactl %s, /dev/nvidia-uvm %s, %s)\n",
                rc, ctl ? "present" : "missing", uvm ? "present" : "missing", seen);
    if (rc == CUDA_SUCCESS) {
        initialised = 1;
        device_count = count_gpus();
        if (device_count == 0) return CUDA_ERROR_NO_DEVICE;
    }
    return rc;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 13000; /* CUDA 13.0, what the 580 branch reports */
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device || ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!name || len <= 0 || dev < 0 || dev >= device_count) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "NVIDIA RTX PRO 6000 Blackwell Server Edition (lab stand-in)");
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *str = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *str = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_SYSTEM_NOT_READY: *str = "CUDA_ERROR_SYSTEM_NOT_READY"; break;
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: *str = "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"; break;
    default: *str = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *str = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "invalid argument"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *str = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "invalid device context"; break;
    case CUDA_ERROR_SYSTEM_NOT_READY: *str = "system not yet initialized"; break;
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: *str = "system has unsupported display driver / cuda driver combination"; break;
    default: *str = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Virtual memory management and pointer queries (sgl-kernel's custom allreduce and memory saver link them). No
 * context can exist without a GPU, so every call after cuInit answers as one made without a current context. */
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

static CUresult no_context(void) {
    return initialised ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { (void)ptr; (void)size; return no_context(); }
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    (void)pbase; (void)psize; (void)dptr; return no_context();
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { (void)handle; return no_context(); }
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    (void)handle; (void)addr; return no_context();
}
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count) {
    (void)ptr; (void)size; (void)desc; (void)count; return no_context();
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { (void)ptr; (void)size; return no_context(); }
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    (void)data; (void)attribute; (void)ptr; return no_context();
}
