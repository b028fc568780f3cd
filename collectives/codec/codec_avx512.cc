// The AVX-512 codec kernels (F, BW); compiled with -mavx512f -mavx512bw -mavx512dq and
// -ffp-contract=off, and only called after cpuSupports(Isa::kAvx512).
#define NANOCCL_SIMD_WIDTH 512
#define NANOCCL_SIMD_FILL fillAvx512Kernels
#include "collectives/codec/codec_simd.inc"
