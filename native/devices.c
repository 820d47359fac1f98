/*
 * devices.c - the compute devices this llama.cpp build registered (ggml-backend's device
 * registry: CPU always, plus CUDA or Vulkan devices in those builds), with their memory.
 * The engine reports the device its layers went to, and its memory, from this list.
 */

#include <ggml-backend.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "stt.h"

/* One line per device, "name\tdescription\ttype\tfree_bytes\ttotal_bytes\n", type one of
 * cpu, gpu, igpu, accel. Returns the number of devices, or -1 when buf is too small. */
STT_API int32_t stt_devices(char *buf, int32_t len) {
    if (buf == NULL || len <= 0) return -1;
    buf[0] = '\0';
    size_t used = 0;
    const size_t n = ggml_backend_dev_count();
    for (size_t i = 0; i < n; i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        size_t free_b = 0, total_b = 0;
        ggml_backend_dev_memory(dev, &free_b, &total_b);
        const char *type = "accel";
        switch (ggml_backend_dev_type(dev)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU:  type = "cpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_GPU:  type = "gpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU: type = "igpu"; break;
            default: break;
        }
        int k = snprintf(buf + used, (size_t)len - used, "%s\t%s\t%s\t%zu\t%zu\n", ggml_backend_dev_name(dev),
                         ggml_backend_dev_description(dev), type, free_b, total_b);
        if (k < 0 || (size_t)k >= (size_t)len - used) return -1;
        used += (size_t)k;
    }
    return (int32_t)n;
}
