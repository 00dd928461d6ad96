/*
 * quant.c — the table of tensor types (see quant.h). Block sizes and block
 * byte counts are GGUF's public layouts.
 */
#include "quant.h"

#include <stddef.h>
#include <strings.h>

#include "util.h"

static const quant_type_info type_table[QT_COUNT] = {
    [QT_F32] = {"F32", 1, 4},
    [QT_F16] = {"F16", 1, 2},
    [QT_Q4_0] = {"Q4_0", 32, 18},
    [QT_Q4_1] = {"Q4_1", 32, 20},
    [QT_Q5_0] = {"Q5_0", 32, 22},
    [QT_Q5_1] = {"Q5_1", 32, 24},
    [QT_Q8_0] = {"Q8_0", 32, 34},
    [QT_Q8_1] = {"Q8_1", 32, 40},
    [QT_Q2_K] = {"Q2_K", 256, 84},
    [QT_Q3_K] = {"Q3_K", 256, 110},
    [QT_Q4_K] = {"Q4_K", 256, 144},
    [QT_Q5_K] = {"Q5_K", 256, 176},
    [QT_Q6_K] = {"Q6_K", 256, 210},
    [QT_Q8_K] = {"Q8_K", 256, 292},
    [QT_IQ2_XXS] = {"IQ2_XXS", 256, 66},
    [QT_IQ2_XS] = {"IQ2_XS", 256, 74},
    [QT_IQ3_XXS] = {"IQ3_XXS", 256, 98},
    [QT_IQ1_S] = {"IQ1_S", 256, 50},
    [QT_IQ4_NL] = {"IQ4_NL", 32, 18},
    [QT_IQ3_S] = {"IQ3_S", 256, 110},
    [QT_IQ2_S] = {"IQ2_S", 256, 82},
    [QT_IQ4_XS] = {"IQ4_XS", 256, 136},
    [QT_I8] = {"I8", 1, 1},
    [QT_I16] = {"I16", 1, 2},
    [QT_I32] = {"I32", 1, 4},
    [QT_I64] = {"I64", 1, 8},
    [QT_F64] = {"F64", 1, 8},
    [QT_IQ1_M] = {"IQ1_M", 256, 56},
    [QT_BF16] = {"BF16", 1, 2},
    [QT_TQ1_0] = {"TQ1_0", 256, 54},
    [QT_TQ2_0] = {"TQ2_0", 256, 66},
    [QT_MXFP4] = {"MXFP4", 32, 17},
};

const quant_type_info *quant_type_get(uint32_t type) {
    if (type >= QT_COUNT || type_table[type].name == NULL) return NULL;
    return &type_table[type];
}

const quant_type_info *quant_type_by_name(const char *name, uint32_t *type) {
    if (!name) return NULL;
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        if (type_table[t].name && strcasecmp(type_table[t].name, name) == 0) {
            if (type) *type = t;
            return &type_table[t];
        }
    }
    return NULL;
}

bool quant_nbytes(uint32_t type, uint64_t n, uint64_t *bytes) {
    const quant_type_info *info = quant_type_get(type);
    if (!info || n % info->block_size != 0) return false;
    return u64_mul(n / info->block_size, info->type_size, bytes);
}
