/* safetensors.h - read-only, mmapped access to a Hugging Face safetensors checkpoint.
 *
 * st_open takes a model folder and opens `model.safetensors`, or every shard named by
 * `model.safetensors.index.json`. Headers are validated completely at open (JSON shape,
 * dtypes, offsets inside the file and non-overlapping, byte counts matching the shape), so a
 * truncated or lying file is an error naming the file and the tensor, never a crash later.
 * Tensor data points into the mapping and lives until st_close. */
#ifndef PAGELLM_SAFETENSORS_H
#define PAGELLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef struct {
    const char *name;
    const char *file;       /* path of the shard holding it (for error messages) */
    DType dtype;            /* DT_OTHER for dtypes pagellm does not compute with */
    const char *dtype_name; /* as written in the header: "BF16", "I64", ... */
    int ndim;
    int64_t shape[8];
    const void *data;
    size_t nbytes;
} StTensor;

typedef struct StCheckpoint StCheckpoint;

/* Open the checkpoint in folder `dir`. On failure returns non-OK with pl_error() set. */
Status st_open(const char *dir, StCheckpoint **out);

/* Open one safetensors file directly. */
Status st_open_file(const char *path, StCheckpoint **out);

/* The tensor called `name`, or NULL. */
const StTensor *st_find(const StCheckpoint *ck, const char *name);

/* Number of tensors and the i-th one (stable order: file order, then header order). */
int st_count(const StCheckpoint *ck);
const StTensor *st_tensor(const StCheckpoint *ck, int i);

/* Unmap and free. NULL is a no-op. */
void st_close(StCheckpoint *ck);

#endif
