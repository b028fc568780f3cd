// The AVX-512 reduction kernels (F, BW for 8/16-bit lanes, DQ for the 64-bit multiply); compiled
// with -mavx512f -mavx512bw -mavx512dq and -ffp-contract=off, and only called after
// cpuSupports(Isa::kAvx512).
#define NANOCCL_SIMD_WIDTH 512
#define NANOCCL_SIMD_FILL fillAvx512Kernels
#include "common/reduce_simd.inc"
