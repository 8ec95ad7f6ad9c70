// Lets a CUDA kernel source compile as plain C++ for the host-side kernel tests: the CUDA
// qualifiers vanish, block and thread indices are globals the test sets, __syncthreads is a
// no-op (the tests run one emulated thread at a time in an order that respects it) and
// atomicMin is a plain minimum.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __constant__
#define __global__
#define __shared__ static
#define __launch_bounds__(x)
#define __syncthreads()
struct Dim { unsigned x; };
struct uint4 { unsigned x, y, z, w; };
static Dim threadIdx, blockIdx;
[[maybe_unused]] static unsigned atomicMin(unsigned *a, unsigned b) { unsigned o = *a; if (b < o) *a = b; return o; }
