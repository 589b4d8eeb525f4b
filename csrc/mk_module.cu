// mk_module.cu: the pybind11 module `mk_native`: launches the megakernel on tensors handed over as
// data_ptr() integers (so the module links only the CUDA runtime, never libtorch).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "mk_launch.h"

namespace py = pybind11;

namespace {

mk::Params make_params(const std::vector<long long>& ptrs, const std::vector<long long>& ints,
                       const std::vector<double>& floats) {
  static const char* const ptr_names[] = {
#define MK_N(name) #name,
      MK_PARAM_PTRS(MK_N)
#undef MK_N
  };
  static const char* const int_names[] = {
#define MK_N(name) #name,
      MK_PARAM_INTS(MK_N)
#undef MK_N
  };
  const size_t n_ptr = sizeof(ptr_names) / sizeof(ptr_names[0]);
  const size_t n_int = sizeof(int_names) / sizeof(int_names[0]);
  (void)ptr_names[0];
  (void)int_names[0];
  size_t n_float = 0;
#define MK_C(name) ++n_float;
  MK_PARAM_FLOATS(MK_C)
#undef MK_C
  if (ptrs.size() != n_ptr || ints.size() != n_int || floats.size() != n_float)
    throw std::invalid_argument("mk_native: parameter lists do not match the ABI (" + std::to_string(ptrs.size()) +
                                "/" + std::to_string(n_ptr) + " pointers, " + std::to_string(ints.size()) + "/" +
                                std::to_string(n_int) + " ints, " + std::to_string(floats.size()) + "/" +
                                std::to_string(n_float) + " floats)");
  mk::Params p{};
  size_t i = 0;
#define MK_P(name) p.name = reinterpret_cast<void*>(ptrs[i++]);
  MK_PARAM_PTRS(MK_P)
#undef MK_P
  i = 0;
#define MK_I(name) p.name = static_cast<int>(ints[i++]);
  MK_PARAM_INTS(MK_I)
#undef MK_I
  i = 0;
#define MK_F(name) p.name = static_cast<float>(floats[i++]);
  MK_PARAM_FLOATS(MK_F)
#undef MK_F
  return p;
}

size_t smem_for(const std::vector<long long>& ptrs, const std::vector<long long>& ints,
                const std::vector<double>& floats, int max_k) {
  return mk::smem_bytes(make_params(ptrs, ints, floats), max_k);
}

// Launch one step on `stream` (a cudaStream_t as an integer); returns immediately.
void launch(const std::vector<long long>& ptrs, const std::vector<long long>& ints, const std::vector<double>& floats,
            int max_k, long long stream) {
  const mk::Params p = make_params(ptrs, ints, floats);
  char msg[512] = {0};
  cudaError_t e;
  {
    py::gil_scoped_release nogil;
    e = mk::launch_step(p, max_k, reinterpret_cast<cudaStream_t>(stream), msg, sizeof(msg));
  }
  if (e != cudaSuccess) throw std::runtime_error(std::string("mk_native: ") + msg);
}

py::dict device_info() {
  py::dict d;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  d["device_count"] = e == cudaSuccess ? n : 0;
  d["error"] = e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  d["runtime_version"] = rt;
  d["driver_version"] = drv;
  if (n > 0) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      d["name"] = std::string(prop.name);
      d["sm_count"] = prop.multiProcessorCount;
      d["cc"] = prop.major * 10 + prop.minor;
      d["smem_optin"] = (long long)prop.sharedMemPerBlockOptin;
      d["l2_bytes"] = prop.l2CacheSize;
    }
  }
  return d;
}

}  // namespace

PYBIND11_MODULE(mk_native, m) {
  m.doc() = "mkcode decode megakernel (one persistent CUDA kernel per decode step)";
  m.attr("ABI_VERSION") = MK_ABI_VERSION;
  m.attr("THREADS") = mk::kThreads;
  m.def("launch", &launch, py::arg("ptrs"), py::arg("ints"), py::arg("floats"), py::arg("max_k"), py::arg("stream"));
  m.def("smem_bytes", &smem_for, py::arg("ptrs"), py::arg("ints"), py::arg("floats"), py::arg("max_k"));
  m.def("device_info", &device_info);
}
