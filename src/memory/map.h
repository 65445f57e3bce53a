/* Mappings of the memory layer's own, shared by its files (not public). */
#ifndef ES_MEMORY_MAP_H
#define ES_MEMORY_MAP_H

#include <stddef.h>

#include "edgeserve/memory.h"

/* es_mem_map for memory that is large and used whole (weights, arenas):
 * from 2 MiB on, the mapping starts on a 2 MiB boundary and is advised for
 * transparent huge pages (one fault per 2 MiB instead of per 4 KiB, and a
 * TLB entry covering 512 times the bytes: oneDNN's convolutions stream
 * activations of tens of MB); smaller, plain es_mem_map. Advice only: the
 * kernel may still give 4 KiB pages. Unmap with es_mem_unmap. */
void *es__mem_map_large(es_mem_tag tag, size_t size);

#endif
