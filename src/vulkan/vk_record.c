/*
 * vk_record.c — compute pipelines and recorders (vk_device.h). A pipeline
 * is made once per shader from the embedded SPIR-V. A recorder is one
 * command buffer with its fence: an engine step records every dispatch of
 * the step into it, with barriers between dependent ones, then submits it
 * once and waits once. Storage buffers reach a shader through push
 * descriptors where the device has VK_KHR_push_descriptor (nothing to
 * allocate per dispatch), else through sets taken from descriptor pools
 * that the recorder keeps and resets at the start of each recording.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vulkan/vk_internal.h"

enum { MAX_BINDINGS = 12 }; /* storage buffers of one shader at most */

/* ---- pipelines ---- */

void vk_pipeline_destroy(vk_device *d, vk_pipeline *p) {
    if (!p) return;
    if (p->pipe) {
        d->fn.vkDestroyPipeline(d->dev, p->pipe, NULL);
        vk_live_add(-1);
    }
    if (p->layout) {
        d->fn.vkDestroyPipelineLayout(d->dev, p->layout, NULL);
        vk_live_add(-1);
    }
    if (p->set_layout) {
        d->fn.vkDestroyDescriptorSetLayout(d->dev, p->set_layout, NULL);
        vk_live_add(-1);
    }
    free(p);
}

static cellm_status pipeline_create(vk_device *d, vk_shader_id id, const uint32_t spec_in[4],
                                    vk_pipeline **out, cellm_error *err) {
    const vk_shader_desc *desc = vk_shader_get(id);
    const vk_spirv *spv = desc ? vk_spirv_find(desc->spirv) : NULL;
    if (!spv || desc->n_bindings > MAX_BINDINGS)
        return err_set(err, CELLM_ERR_INTERNAL, "Vulkan shader %d is not in the library", (int)id);
    vk_pipeline *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    p->desc = desc;
    p->id = id;
    memcpy(p->spec, spec_in, sizeof p->spec);
    VkDescriptorSetLayoutBinding binds[MAX_BINDINGS];
    for (uint32_t i = 0; i < desc->n_bindings; i++)
        binds[i] = (VkDescriptorSetLayoutBinding){
            .binding = i,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .descriptorCount = 1,
            .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        };
    VkDescriptorSetLayoutCreateInfo sl = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .flags = d->use_push ? VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR : 0,
        .bindingCount = desc->n_bindings,
        .pBindings = binds,
    };
    /* Each handle is stored only once its call succeeded, so that
     * vk_pipeline_destroy undoes exactly what was made. */
    const char *call = "vkCreateDescriptorSetLayout";
    VkDescriptorSetLayout set_layout;
    VkResult r = d->fn.vkCreateDescriptorSetLayout(d->dev, &sl, NULL, &set_layout);
    if (r == VK_SUCCESS) {
        p->set_layout = set_layout;
        vk_live_add(1);
        VkPushConstantRange pc = {
            .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = desc->push_bytes};
        VkPipelineLayoutCreateInfo pl = {
            .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
            .setLayoutCount = 1,
            .pSetLayouts = &p->set_layout,
            .pushConstantRangeCount = desc->push_bytes ? 1 : 0,
            .pPushConstantRanges = &pc,
        };
        call = "vkCreatePipelineLayout";
        VkPipelineLayout layout;
        r = d->fn.vkCreatePipelineLayout(d->dev, &pl, NULL, &layout);
        if (r == VK_SUCCESS) {
            p->layout = layout;
            vk_live_add(1);
        }
    }
    VkShaderModule mod = VK_NULL_HANDLE;
    if (r == VK_SUCCESS) {
        VkShaderModuleCreateInfo mi = {
            .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            .codeSize = spv->bytes,
            .pCode = (const uint32_t *)(const void *)spv->code,
        };
        call = "vkCreateShaderModule";
        r = d->fn.vkCreateShaderModule(d->dev, &mi, NULL, &mod);
    }
    if (r == VK_SUCCESS) {
        uint32_t spec[4];
        VkSpecializationMapEntry map[4];
        uint32_t n_spec = desc->n_spec < 4 ? desc->n_spec : 4;
        for (uint32_t i = 0; i < n_spec; i++) {
            spec[i] = p->spec[i];
            map[i] = (VkSpecializationMapEntry){.constantID = i, .offset = 4 * i, .size = 4};
        }
        VkSpecializationInfo si = {
            .mapEntryCount = n_spec, .pMapEntries = map, .dataSize = 4 * n_spec, .pData = spec};
        VkComputePipelineCreateInfo ci = {
            .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            .stage =
                {
                    .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                    .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                    .module = mod,
                    .pName = "main",
                    .pSpecializationInfo = n_spec ? &si : NULL,
                },
            .layout = p->layout,
        };
        call = "vkCreateComputePipelines";
        VkPipeline pipe;
        r = d->fn.vkCreateComputePipelines(d->dev, VK_NULL_HANDLE, 1, &ci, NULL, &pipe);
        d->fn.vkDestroyShaderModule(d->dev, mod, NULL);
        if (r == VK_SUCCESS) {
            p->pipe = pipe;
            vk_live_add(1);
        }
    }
    if (r != VK_SUCCESS) {
        vk_pipeline_destroy(d, p);
        return vk_fail(err, call, r);
    }
    *out = p;
    return CELLM_OK;
}

cellm_status vk_pipeline_get_spec(vk_device *d, vk_shader_id id, const uint32_t spec[4],
                                  const vk_pipeline **out, cellm_error *err) {
    *out = NULL;
    const vk_shader_desc *desc = vk_shader_get(id);
    if (!desc) return err_set(err, CELLM_ERR_INVALID_ARG, "no Vulkan shader %d", (int)id);
    uint32_t want[4] = {0};
    for (uint32_t i = 0; i < desc->n_spec && i < 4; i++) {
        want[i] = spec ? spec[i] : desc->spec[i];
        if (want[i] == VK_SPEC_SUBGROUP_SIZE) want[i] = d->info.subgroup_size;
    }
    for (vk_pipeline *p = d->pipes; p; p = p->next)
        if (p->id == id && !memcmp(p->spec, want, sizeof want)) {
            *out = p;
            return CELLM_OK;
        }
    vk_pipeline *p;
    cellm_status st = pipeline_create(d, id, want, &p, err);
    if (st != CELLM_OK) return st;
    p->next = d->pipes;
    d->pipes = p;
    *out = p;
    return CELLM_OK;
}

cellm_status vk_pipeline_get(vk_device *d, vk_shader_id id, const vk_pipeline **out,
                             cellm_error *err) {
    return vk_pipeline_get_spec(d, id, NULL, out, err);
}

/* ---- recorders ---- */

size_t vk_binding_shift(const vk_device *d, size_t offset) {
    return offset % d->storage_align;
}

vk_device *vk_recorder_device(vk_recorder *rec) {
    return rec->dev;
}

cellm_status vk_recorder_create(vk_device *d, vk_recorder **out, cellm_error *err) {
    *out = NULL;
    vk_recorder *rec = calloc(1, sizeof *rec);
    if (!rec) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    rec->dev = d;
    rec->gpu_ns = -1;
    rec->next = d->recorders;
    if (d->recorders) d->recorders->prev = rec;
    d->recorders = rec;
    vk_live_add(1);
    VkCommandPoolCreateInfo pi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = d->queue_family,
    };
    VkResult r = d->fn.vkCreateCommandPool(d->dev, &pi, NULL, &rec->cmd_pool);
    const char *call = "vkCreateCommandPool";
    if (r == VK_SUCCESS) {
        VkCommandBufferAllocateInfo ai = {
            .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            .commandPool = rec->cmd_pool,
            .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            .commandBufferCount = 1,
        };
        call = "vkAllocateCommandBuffers";
        r = d->fn.vkAllocateCommandBuffers(d->dev, &ai, &rec->cmd);
    } else {
        rec->cmd_pool = VK_NULL_HANDLE;
    }
    if (r == VK_SUCCESS) {
        VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        call = "vkCreateFence";
        r = d->fn.vkCreateFence(d->dev, &fi, NULL, &rec->fence);
        if (r != VK_SUCCESS) rec->fence = VK_NULL_HANDLE;
    }
    if (r == VK_SUCCESS && d->info.timestamps) {
        VkQueryPoolCreateInfo qi = {
            .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
            .queryType = VK_QUERY_TYPE_TIMESTAMP,
            .queryCount = 2 + VK_MARKS_MAX,
        };
        call = "vkCreateQueryPool";
        r = d->fn.vkCreateQueryPool(d->dev, &qi, NULL, &rec->queries);
        if (r != VK_SUCCESS) rec->queries = VK_NULL_HANDLE;
    }
    if (r != VK_SUCCESS) {
        vk_recorder_free(rec);
        return vk_fail(err, call, r);
    }
    *out = rec;
    return CELLM_OK;
}

/* Waits for the recorder's submission, if one is pending. */
static cellm_status wait_pending(vk_recorder *rec, cellm_error *err) {
    if (!rec->pending) return CELLM_OK;
    vk_device *d = rec->dev;
    if (d->spin_ns > 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            VkResult s = d->fn.vkGetFenceStatus(d->dev, rec->fence);
            if (s == VK_SUCCESS) {
                rec->pending = false;
                return CELLM_OK;
            }
            if (s != VK_NOT_READY) return vk_fail(err, "vkGetFenceStatus", s);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec) >
                d->spin_ns)
                break;
        }
    }
    VkResult r =
        d->fn.vkWaitForFences(d->dev, 1, &rec->fence, VK_TRUE, (uint64_t)d->timeout_ms * 1000000u);
    if (r == VK_TIMEOUT)
        return err_set(err, CELLM_ERR_IO, "Vulkan: a submission timed out after %u ms",
                       d->timeout_ms);
    if (r != VK_SUCCESS) return vk_fail(err, "vkWaitForFences", r);
    rec->pending = false;
    return CELLM_OK;
}

void vk_recorder_free(vk_recorder *rec) {
    if (!rec) return;
    vk_device *d = rec->dev;
    if (rec->pending && wait_pending(rec, NULL) != CELLM_OK) d->fn.vkDeviceWaitIdle(d->dev);
    for (uint32_t i = 0; i < rec->n_pools; i++)
        d->fn.vkDestroyDescriptorPool(d->dev, rec->pools[i], NULL);
    if (rec->queries) d->fn.vkDestroyQueryPool(d->dev, rec->queries, NULL);
    free(rec->mark_tags);
    free(rec->mark_ns);
    if (rec->fence) d->fn.vkDestroyFence(d->dev, rec->fence, NULL);
    if (rec->cmd_pool) d->fn.vkDestroyCommandPool(d->dev, rec->cmd_pool, NULL);
    if (rec->prev)
        rec->prev->next = rec->next;
    else
        d->recorders = rec->next;
    if (rec->next) rec->next->prev = rec->prev;
    if (d->xfer == rec) d->xfer = NULL;
    vk_live_add(-1);
    free(rec);
}

/* Keeps the first error of a recording (vk_recorder_submit returns it) and
 * passes it on to `err`. */
static cellm_status keep(vk_recorder *rec, const cellm_error *e, cellm_error *err) {
    if (rec->error.code == CELLM_OK) rec->error = *e;
    if (err) *err = *e;
    return e->code;
}

cellm_status vk_recorder_begin(vk_recorder *rec, cellm_error *err) {
    vk_device *d = rec->dev;
    cellm_status st = wait_pending(rec, err);
    if (st != CELLM_OK) return st;
    if (rec->recording) d->fn.vkEndCommandBuffer(rec->cmd); /* an abandoned recording */
    rec->recording = false;
    rec->replayable = false;
    err_clear(&rec->error);
    rec->bound = NULL;
    for (uint32_t i = 0; i < rec->n_pools; i++)
        d->fn.vkResetDescriptorPool(d->dev, rec->pools[i], 0);
    rec->pool_cur = rec->pool_used = 0;
    VkCommandBufferBeginInfo bi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = 0, /* vk_recorder_resubmit may submit it again */
    };
    VkResult r = d->fn.vkBeginCommandBuffer(rec->cmd, &bi);
    if (r != VK_SUCCESS) return vk_fail(err, "vkBeginCommandBuffer", r);
    rec->recording = true;
    rec->timed = rec->queries != VK_NULL_HANDLE;
    rec->n_marks = 0;
    if (rec->timed) {
        d->fn.vkCmdResetQueryPool(rec->cmd, rec->queries, 0, rec->marks_on ? 2 + VK_MARKS_MAX : 2);
        d->fn.vkCmdWriteTimestamp(rec->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, rec->queries, 0);
    }
    return CELLM_OK;
}

static cellm_status not_recording(vk_recorder *rec, cellm_error *err) {
    cellm_error e;
    err_set(&e, CELLM_ERR_INVALID_ARG, "Vulkan recorder: no recording begun");
    return keep(rec, &e, err);
}

/* A descriptor set for `p` from the recorder's pools, making a pool when
 * the last one is full. */
static cellm_status pool_set(vk_recorder *rec, const vk_pipeline *p, VkDescriptorSet *set,
                             cellm_error *e) {
    vk_device *d = rec->dev;
    for (;;) {
        if (rec->pool_cur < rec->n_pools && rec->pool_used < VK_POOL_SETS) {
            VkDescriptorSetAllocateInfo ai = {
                .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                .descriptorPool = rec->pools[rec->pool_cur],
                .descriptorSetCount = 1,
                .pSetLayouts = &p->set_layout,
            };
            VkResult r = d->fn.vkAllocateDescriptorSets(d->dev, &ai, set);
            if (r == VK_SUCCESS) {
                rec->pool_used++;
                return CELLM_OK;
            }
            if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL)
                return vk_fail(e, "vkAllocateDescriptorSets", r);
        }
        /* The next pool: one made before, or a new one. */
        if (rec->pool_cur < rec->n_pools) rec->pool_cur++;
        rec->pool_used = 0;
        if (rec->pool_cur < rec->n_pools) continue;
        if (rec->n_pools == VK_POOL_MAX)
            return err_set(e, CELLM_ERR_NO_MEMORY,
                           "Vulkan recorder: more than %d dispatches in one recording",
                           VK_POOL_SETS * VK_POOL_MAX);
        VkDescriptorPoolSize size = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                     .descriptorCount = VK_POOL_SETS * MAX_BINDINGS};
        VkDescriptorPoolCreateInfo ci = {
            .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
            .maxSets = VK_POOL_SETS,
            .poolSizeCount = 1,
            .pPoolSizes = &size,
        };
        VkResult r = d->fn.vkCreateDescriptorPool(d->dev, &ci, NULL, &rec->pools[rec->n_pools]);
        if (r != VK_SUCCESS) return vk_fail(e, "vkCreateDescriptorPool", r);
        rec->pool_cur = rec->n_pools++;
    }
}

cellm_status vk_recorder_dispatch(vk_recorder *rec, const vk_pipeline *p, const vk_binding *b,
                                  uint32_t n_bindings, const void *push, size_t push_bytes,
                                  const uint32_t groups[3], cellm_error *err) {
    if (!rec->recording) return not_recording(rec, err);
    vk_device *d = rec->dev;
    cellm_error e;
    err_clear(&e);
    if (!p || n_bindings != p->desc->n_bindings || push_bytes != p->desc->push_bytes) {
        err_set(&e, CELLM_ERR_INVALID_ARG,
                "Vulkan dispatch of %s: %u bindings and %zu push bytes, the shader takes %u and %u",
                p ? p->desc->spirv : "(no pipeline)", n_bindings, push_bytes,
                p ? p->desc->n_bindings : 0, p ? p->desc->push_bytes : 0);
        return keep(rec, &e, err);
    }
    for (int i = 0; i < 3; i++)
        if (groups[i] == 0 || groups[i] > d->info.max_workgroups[i]) {
            err_set(
                &e, CELLM_ERR_INVALID_ARG,
                "Vulkan dispatch of %s: %u workgroups in dimension %d (the device takes 1 to %u)",
                p->desc->spirv, groups[i], i, d->info.max_workgroups[i]);
            return keep(rec, &e, err);
        }
    VkDescriptorBufferInfo info[MAX_BINDINGS];
    VkWriteDescriptorSet writes[MAX_BINDINGS];
    for (uint32_t i = 0; i < n_bindings; i++) {
        const vk_buffer *buf = b[i].buf;
        size_t end = b[i].range ? b[i].offset + b[i].range : (buf ? buf->size : 0);
        if (!buf || b[i].offset >= buf->size || end > buf->size || end <= b[i].offset) {
            err_set(&e, CELLM_ERR_INVALID_ARG,
                    "Vulkan dispatch of %s: binding %u (%zu bytes at %zu) is outside its buffer "
                    "(%zu bytes)",
                    p->desc->spirv, i, b[i].range, b[i].offset, buf ? buf->size : 0);
            return keep(rec, &e, err);
        }
        size_t base = b[i].offset - b[i].offset % d->storage_align;
        /* Whole 32-bit words: shaders read the last bytes of an odd-sized
         * range as part of a word (the buffer has the room: vk_bytes). */
        end = (end + 3) & ~(size_t)3;
        if (end > buf->vk_bytes) end = buf->vk_bytes;
        if (end - base > d->info.max_storage_range) {
            err_set(
                &e, CELLM_ERR_UNSUPPORTED,
                "Vulkan dispatch of %s: binding %u spans %zu bytes, the device binds at most %llu",
                p->desc->spirv, i, end - base, (unsigned long long)d->info.max_storage_range);
            return keep(rec, &e, err);
        }
        info[i] = (VkDescriptorBufferInfo){.buffer = buf->buf, .offset = base, .range = end - base};
        writes[i] = (VkWriteDescriptorSet){
            .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
            .dstBinding = i,
            .descriptorCount = 1,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .pBufferInfo = &info[i],
        };
    }
    if (rec->bound != p) {
        d->fn.vkCmdBindPipeline(rec->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
        rec->bound = p;
    }
    if (d->use_push) {
        d->fn.vkCmdPushDescriptorSetKHR(rec->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0,
                                        n_bindings, writes);
    } else {
        VkDescriptorSet set;
        if (pool_set(rec, p, &set, &e) != CELLM_OK) return keep(rec, &e, err);
        for (uint32_t i = 0; i < n_bindings; i++) writes[i].dstSet = set;
        d->fn.vkUpdateDescriptorSets(d->dev, n_bindings, writes, 0, NULL);
        d->fn.vkCmdBindDescriptorSets(rec->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1,
                                      &set, 0, NULL);
    }
    if (push_bytes)
        d->fn.vkCmdPushConstants(rec->cmd, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                 (uint32_t)push_bytes, push);
    d->fn.vkCmdDispatch(rec->cmd, groups[0], groups[1], groups[2]);
    return CELLM_OK;
}

/* A memory barrier from the stages in `src` to those in `dst`. */
static void barrier(vk_recorder *rec, VkPipelineStageFlags src, VkAccessFlags src_access,
                    VkPipelineStageFlags dst, VkAccessFlags dst_access) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = src_access,
                          .dstAccessMask = dst_access};
    rec->dev->fn.vkCmdPipelineBarrier(rec->cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static const VkPipelineStageFlags WORK_STAGES =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

void vk_recorder_barrier(vk_recorder *rec) {
    if (!rec->recording) return;
    barrier(rec, WORK_STAGES, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
            WORK_STAGES,
            VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                VK_ACCESS_TRANSFER_WRITE_BIT);
}

static cellm_status range_error(vk_recorder *rec, const char *what, const vk_buffer *b, size_t off,
                                size_t bytes, cellm_error *err) {
    cellm_error e;
    err_set(&e, CELLM_ERR_INVALID_ARG, "Vulkan %s of %zu bytes at %zu: the buffer has %zu", what,
            bytes, off, b ? b->size : 0);
    return keep(rec, &e, err);
}

static bool in_range(const vk_buffer *b, size_t off, size_t bytes) {
    return b && off <= b->size && bytes <= b->size - off;
}

cellm_status vk_recorder_copy(vk_recorder *rec, const vk_buffer *src, size_t src_off,
                              const vk_buffer *dst, size_t dst_off, size_t bytes,
                              cellm_error *err) {
    if (!rec->recording) return not_recording(rec, err);
    if (!in_range(src, src_off, bytes))
        return range_error(rec, "copy source", src, src_off, bytes, err);
    if (!in_range(dst, dst_off, bytes))
        return range_error(rec, "copy destination", dst, dst_off, bytes, err);
    if (bytes == 0) return CELLM_OK;
    VkBufferCopy c = {.srcOffset = src_off, .dstOffset = dst_off, .size = bytes};
    rec->dev->fn.vkCmdCopyBuffer(rec->cmd, src->buf, dst->buf, 1, &c);
    return CELLM_OK;
}

cellm_status vk_recorder_fill(vk_recorder *rec, const vk_buffer *dst, size_t offset, size_t bytes,
                              uint32_t value, cellm_error *err) {
    if (!rec->recording) return not_recording(rec, err);
    if (!in_range(dst, offset, bytes) || offset % 4 || bytes % 4)
        return range_error(rec, "fill (4-byte aligned)", dst, offset, bytes, err);
    if (bytes == 0) return CELLM_OK;
    rec->dev->fn.vkCmdFillBuffer(rec->cmd, dst->buf, offset, bytes, value);
    return CELLM_OK;
}

static cellm_status run_recorded(vk_recorder *rec, cellm_error *err);

cellm_status vk_recorder_submit(vk_recorder *rec, cellm_error *err) {
    if (!rec->recording) return not_recording(rec, err);
    vk_device *d = rec->dev;
    if (rec->error.code != CELLM_OK) {
        d->fn.vkEndCommandBuffer(rec->cmd);
        rec->recording = false;
        if (err) *err = rec->error;
        return rec->error.code;
    }
    /* The host reads what the recording wrote (mapped readback buffers). */
    barrier(rec, WORK_STAGES, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
            VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    if (rec->timed)
        d->fn.vkCmdWriteTimestamp(rec->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, rec->queries, 1);
    rec->recording = false;
    rec->replayable = false;
    VkResult r = d->fn.vkEndCommandBuffer(rec->cmd);
    if (r != VK_SUCCESS) return vk_fail(err, "vkEndCommandBuffer", r);
    rec->replayable = true;
    return run_recorded(rec, err);
}

cellm_status vk_recorder_resubmit(vk_recorder *rec, cellm_error *err) {
    if (rec->recording || !rec->replayable) {
        cellm_error e;
        err_set(&e, CELLM_ERR_INVALID_ARG,
                "Vulkan recorder: no finished recording to submit again");
        if (err) *err = e;
        return e.code;
    }
    cellm_status st = wait_pending(rec, err);
    if (st != CELLM_OK) return st;
    return run_recorded(rec, err);
}

/* Submits the ended recording, waits for it and reads its timestamps. */
static cellm_status run_recorded(vk_recorder *rec, cellm_error *err) {
    vk_device *d = rec->dev;
    VkResult r = d->fn.vkResetFences(d->dev, 1, &rec->fence);
    if (r != VK_SUCCESS) return vk_fail(err, "vkResetFences", r);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                       .commandBufferCount = 1,
                       .pCommandBuffers = &rec->cmd};
    r = d->fn.vkQueueSubmit(d->queue, 1, &si, rec->fence);
    if (r != VK_SUCCESS) return vk_fail(err, "vkQueueSubmit", r);
    rec->pending = true;
    cellm_status st = wait_pending(rec, err);
    if (st != CELLM_OK) return st;
    rec->gpu_ns = -1;
    if (rec->timed) {
        uint64_t ts[2];
        r = d->fn.vkGetQueryPoolResults(d->dev, rec->queries, 0, 2, sizeof ts, ts, sizeof ts[0],
                                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
        if (r == VK_SUCCESS && ts[1] >= ts[0])
            rec->gpu_ns = (double)(ts[1] - ts[0]) * (double)d->timestamp_period;
        /* The raw ticks land in mark_ns's bytes, then become ns in place. */
        uint64_t *raw = (uint64_t *)rec->mark_ns;
        if (r == VK_SUCCESS && rec->n_marks)
            r = d->fn.vkGetQueryPoolResults(d->dev, rec->queries, 2, rec->n_marks,
                                            rec->n_marks * sizeof *raw, raw, sizeof *raw,
                                            VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
        for (uint32_t i = 0; i < rec->n_marks && r == VK_SUCCESS; i++) {
            uint64_t t = raw[i];
            rec->mark_ns[i] = t >= ts[0] ? (double)(t - ts[0]) * (double)d->timestamp_period : 0;
        }
        if (r != VK_SUCCESS) rec->n_marks = 0;
    }
    return CELLM_OK;
}

void vk_recorder_set_marks(vk_recorder *rec, bool on) {
    if (on && !rec->mark_tags) {
        rec->mark_tags = malloc(VK_MARKS_MAX * sizeof *rec->mark_tags);
        rec->mark_ns = malloc(VK_MARKS_MAX * sizeof *rec->mark_ns);
        if (!rec->mark_tags || !rec->mark_ns) on = false; /* profiling only: go without */
    }
    rec->marks_on = on;
}

void vk_recorder_mark(vk_recorder *rec, uint32_t tag) {
    if (!rec->recording || !rec->timed || !rec->marks_on || rec->n_marks == VK_MARKS_MAX) return;
    rec->dev->fn.vkCmdWriteTimestamp(rec->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, rec->queries,
                                     2 + rec->n_marks);
    rec->mark_tags[rec->n_marks++] = tag;
}

uint32_t vk_recorder_marks(const vk_recorder *rec, const uint32_t **tags, const double **ns) {
    *tags = rec->mark_tags;
    *ns = rec->mark_ns;
    return rec->timed && rec->marks_on ? rec->n_marks : 0;
}

double vk_recorder_gpu_ns(const vk_recorder *rec) {
    return rec->gpu_ns;
}
