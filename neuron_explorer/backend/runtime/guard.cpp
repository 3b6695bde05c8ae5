// The neuron device guard in C++: with the Python guard, an exception raised inside a backward
// kernel on the device aborts the process at exit; this one never calls into Python on unwind.
// Built by guard.py with g++ against the installed torch headers and cached.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <time.h>

#include <cstring>

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

// The round trip of each recorded op, exactly (issue 14; runtime/hostcost.py reads it). While
// a profiler records, torch opens a RecordFunction for every dispatcher call, before autograd
// and before the Python subclass's __torch_dispatch__, and closes it once the result is back.
// Per thread we keep the start of the latest FUNCTION record (so at the runtime's entry the
// time since is what autograd, the argument boxing and the Python dispatch took) and the end
// of the one record Python names in `watch` (so the previous op's unboxing and view tracking
// after its span are known at the next op). Python reads and writes the fields in place
// (ctypes at the struct's address, no call); the clock is time.time_ns's, CLOCK_REALTIME.
namespace {
struct RoundTrip {
  int64_t start;      // CLOCK_REALTIME ns at the latest FUNCTION record's start
  int64_t start_id;   // that record's address: the value Python copies into `watch`
  int64_t watch;      // the record whose end is wanted (0: none)
  int64_t watch_end;  // when it ended
};
thread_local RoundTrip t_round_trip{0, 0, 0, 0};
// this thread's callback (a thread-local one, as the profiler's: autograd's device thread gets
// both with the caller's thread-local state); added after the profiler's, it runs after it,
// so torch's event of an op starts before the runtime's span and holds its launch
thread_local at::CallbackHandle t_round_trip_cb = 0;

constexpr int64_t kLeadNs = 200;  // kept on the host clock per op: 0.1 ms a GPT-2 step

inline int64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::unique_ptr<at::ObserverContext> on_record_start(const at::RecordFunction& fn) {
  // torch's own record around the call into a subclass's __torch_dispatch__ opens inside the
  // op's (after autograd and the boxing): the op's record is the one wanted
  const char* name = fn.name();
  if (name[0] == 'P' && std::strcmp(name, "PythonSubclass") == 0) return nullptr;
  RoundTrip& rt = t_round_trip;
  // a profiler started after ours was added runs after ours: its event would start after the
  // runtime's span. Then record no start (0): the runtime adds ours anew (hostcost.resume)
  const auto& tls = at::get_record_function_tls_().sorted_tls_callbacks_;
  if (tls.empty() || tls.back().callback_.start() != &on_record_start) {
    rt.start = 0;
    return nullptr;
  }
  // a little after now: torch's event of the op (the profiler's callback, before ours, reads
  // its clock first but converts it from the TSC) must start no later than the runtime's span
  rt.start = realtime_ns() + kLeadNs;
  rt.start_id = reinterpret_cast<int64_t>(&fn);
  return nullptr;
}

void on_record_end(const at::RecordFunction& fn, at::ObserverContext*) {
  RoundTrip& rt = t_round_trip;
  if (rt.watch == reinterpret_cast<int64_t>(&fn)) {
    rt.watch_end = realtime_ns();
    rt.watch = 0;
  }
}
}  // namespace

// This thread's RoundTrip (valid for the thread's life).
extern "C" int64_t* neuron_round_trip_slot() { return &t_round_trip.start; }

// Turn this thread's callback on (at a capture's first recorded op: added anew, so it runs
// after the profiler's callbacks of this capture) or off (the capture is drained): registered,
// it makes every dispatcher call build a RecordFunction, which the unrecorded path must not pay.
extern "C" void neuron_round_trip(int on) {
  if (t_round_trip_cb != 0) {
    at::removeCallback(t_round_trip_cb);
    t_round_trip_cb = 0;
  }
  if (on) {
    t_round_trip_cb = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_record_start, on_record_end)
            .needsInputs(false)
            .needsOutputs(false)
            .needsIds(false)
            .scopes({at::RecordScope::FUNCTION}));
  }
}
