/* NumPy .npy files (format versions 1-3, C order, little-endian) for the
 * CLI's inputs and outputs. */
#ifndef ES_CLI_NPY_H
#define ES_CLI_NPY_H

#include "edgeserve/engine.h"

/* Reads path into t (dtype, rank, dims, nbytes) and *data (es_mem_alloc'ed,
 * owned by the caller; t->data points to it). ES_EINVAL with a detail for a
 * file that is not a supported .npy. */
int cli_npy_read(const char *path, es_tensor *t);
/* Writes t (dtype, rank, dims, data) to path. */
int cli_npy_write(const char *path, const es_tensor *t);
/* A tensor name as a file name for its .npy: characters outside
 * [A-Za-z0-9._-] become '_'; out holds at most size - 1 of them. */
void cli_npy_file_name(const char *name, char *out, size_t size);

#endif
