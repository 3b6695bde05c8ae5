// The neuron device guard in C++: with the Python guard, an exception raised inside a backward
// kernel on the device aborts the process at exit; this one never calls into Python on unwind.
// Built by guard.py with g++ against the installed torch headers and cached.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {
using SyncCallback = void (*)();
SyncCallback g_sync = nullptr;

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override { return getDevice(); }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, 0); }
  void setDevice(c10::Device d) const override {}
  void uncheckedSetDevice(c10::Device d) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int priority) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return getStream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  bool queryStream(const c10::Stream& s) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override {}
  void synchronizeDevice(const c10::DeviceIndex i) const override { if (g_sync) g_sync(); }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex i, const c10::EventFlag f) const override {}
  void block(void* event, const c10::Stream& s) const override {}
  bool queryEvent(void* event) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex i) const noexcept override {}
  void synchronizeEvent(void* event) const override {}
};
// Hooks: the payload lives in host memory, so "pinned" memory is host memory and the
// device's generator is the CPU one (numerics equal a CPU run with the same seed).
struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex i) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  bool isPinnedPtr(const void* data) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex i) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex i) const override {
    return at::detail::createCPUGenerator();
  }
  at::Device getDeviceFromPtr(void* data) const override {
    return at::Device(c10::DeviceType::PrivateUse1, 0);
  }
};

struct Registrar {
  Registrar() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
};
Registrar registrar;
}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

extern "C" void neuron_set_sync_callback(SyncCallback cb) { g_sync = cb; }
