// Autocast kernels for `neuron` (AutocastPrivateUse1) in C++. torch 2.13 registers none for
// PrivateUse1, so without this every autocast-listed op runs autocast.py's Python kernel: a
// Python round trip per op (~15 us of a 57 us autocast mm). One boxed kernel per policy casts
// the floating tensor arguments by the Python kernel's rule (kept there as the fallback) and
// calls the op again with autocast excluded. autocast.py passes the op names (its lists stay
// the one source); guard.py builds and caches this file like guard.cpp.
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

// Declared as in ATen/autocast_mode.h, whose ATen.h include would triple the build time.
namespace at::autocast {
TORCH_API at::ScalarType get_autocast_dtype(at::DeviceType device_type);
TORCH_API at::Tensor cached_cast(at::ScalarType to_type, const at::Tensor& arg,
                                 c10::DeviceType device_type);
}  // namespace at::autocast

namespace {
std::vector<std::unique_ptr<torch::Library>> g_libs;  // registrations live as long as these
std::string g_error;

// The Python kernel's rule: a floating tensor of another dtype is cast unless it is a CPU
// tensor with dimensions (a CPU operand stays as given; a CPU scalar tensor is cast, float64
// included). A float32 neuron tensor cast to the autocast dtype goes through torch's
// cached_cast: the same `to` call, and a leaf requiring grad (a weight) is cast once per
// autocast region (torch's weight-cast cache, cleared when the outermost region exits).
at::Tensor cast(const at::Tensor& t, at::ScalarType dtype, bool lower) {
  if (!t.defined() || t.scalar_type() == dtype || !t.is_floating_point()) return t;
  if (t.is_cpu() && t.dim() != 0) return t;
  if (lower && t.scalar_type() == at::kFloat && t.is_privateuseone())
    return at::autocast::cached_cast(dtype, t, c10::DeviceType::PrivateUse1);
  return t.to(dtype);
}

template <bool Fp32>
void kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const at::ScalarType dtype =
      Fp32 ? at::kFloat : at::autocast::get_autocast_dtype(c10::DeviceType::PrivateUse1);
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - n; it != stack->end(); ++it) {
    if (it->isTensor()) {
      *it = cast(it->toTensor(), dtype, !Fp32);
    } else if (it->isTensorList()) {  // a new list: the caller's stays as it was
      c10::List<at::Tensor> cast_list;
      for (const at::Tensor& t : it->toTensorList().vec()) cast_list.push_back(cast(t, dtype, !Fp32));
      *it = std::move(cast_list);
    }
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  op.callBoxed(stack);
}
}  // namespace

// Register op `names[i]` ("addmm", "addmm.dtype", ...) with the lower-precision policy
// (fp32[i] == 0) or the float32 one. All or nothing: on an error nothing stays registered and
// it returns 1 (neuron_autocast_error() says why), so the Python kernels can take over.
extern "C" int neuron_autocast_register(const char* const* names, const int* fp32, int n) {
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                c10::DispatchKey::AutocastPrivateUse1, __FILE__,
                                                __LINE__);
    for (int i = 0; i < n; ++i) {
      if (fp32[i])
        lib->impl(names[i], torch::CppFunction::makeFromBoxedFunction<&kernel<true>>());
      else
        lib->impl(names[i], torch::CppFunction::makeFromBoxedFunction<&kernel<false>>());
    }
    g_libs.push_back(std::move(lib));
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return 1;
  }
}

extern "C" const char* neuron_autocast_error() { return g_error.c_str(); }
