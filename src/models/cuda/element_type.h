#pragma once
// The storage types the project's CUDA kernels take, named without CUDA's or ATen's headers, so that a launcher's
// header stays plain C++ for the code that calls it.
namespace dp::models::gpu {

enum class ElementType { F32, F16, BF16 };

}  // namespace dp::models::gpu
