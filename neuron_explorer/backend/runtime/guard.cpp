// The neuron device guard in C++: with the Python guard, an exception raised inside a backward
// kernel on the device aborts the process at exit; this one never calls into Python on unwind.
// Built by guard.py with g++ against the installed torch headers and cached.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {
using SyncCallback = void (*)();
SyncCallback g_sync = nullptr;
// Streams: torch.neuron.Stream is a torch.Stream (backend/streams.py keeps what each stream
// means on the modeled device). The current stream is per thread, as CUDA's; a change made
// through torch (torch.accelerator.set_stream, a StreamGuard) is told to Python, which keeps
// the modeled queues. Ids from here start far above the ones streams.py gives out.
using StreamCallback = void (*)(int64_t);
StreamCallback g_stream_changed = nullptr;
// Only the thread that registered the device is told: autograd's device threads switch streams
// for each node (and back after the graph task ends, when the interpreter may be finalizing),
// and a call into Python there would take the GIL for nothing.
std::thread::id g_python_thread;
thread_local c10::StreamId t_stream = 0;
std::atomic<c10::StreamId> g_next_stream{c10::StreamId(1) << 40};

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override { return getDevice(); }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::PrivateUse1, 0); }
  void setDevice(c10::Device d) const override {}
  void uncheckedSetDevice(c10::Device d) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, getDevice(), t_stream);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return c10::Stream(c10::Stream::UNSAFE, getDevice(), g_next_stream++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream before = getStream(s.device());
    if (s.id() != t_stream) {
      t_stream = s.id();
      if (g_stream_changed && std::this_thread::get_id() == g_python_thread) {
        g_stream_changed(s.id());
      }
    }
    return before;
  }
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

// torch.accelerator's memory API (memory_allocated, max_memory_allocated, memory_stats,
// reset_peak_memory_stats) reads the device type's DeviceAllocator. The payloads are host
// memory, so allocating stays with the allocator registered before this one; the figures are
// the device's own accounting (runtime/memory.py), read through a Python callback.
using MemoryStats = void (*)(int64_t* allocated_peak_free_total);
using ResetPeak = void (*)();
MemoryStats g_memory_stats = nullptr;
ResetPeak g_reset_peak = nullptr;

namespace {
struct NeuronAllocator final : public c10::DeviceAllocator {
  c10::Allocator* base = nullptr;  // what allocated for PrivateUse1 before us

  c10::Allocator* inner() const { return base ? base : c10::GetCPUAllocator(); }
  c10::DataPtr allocate(size_t n) override { return inner()->allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return inner()->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner()->copy_data(dest, src, count);
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // nothing cached: host memory
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    c10::CachingDeviceAllocator::DeviceStats stats;
    int64_t figures[4] = {0, 0, 0, 0};
    if (g_memory_stats) g_memory_stats(figures);
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    for (auto* bytes : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                        &stats.requested_bytes}) {
      (*bytes)[all].current = figures[0];
      (*bytes)[all].peak = figures[1];
    }
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex) override {
    if (g_reset_peak) g_reset_peak();
  }
  // torch.accelerator.get_memory_info(): (free, total) of the modeled chip's HBM
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex) override {
    int64_t figures[4] = {0, 0, 0, 0};
    if (g_memory_stats) g_memory_stats(figures);
    return {static_cast<size_t>(figures[2]), static_cast<size_t>(figures[3])};
  }
};

// torch.accelerator.empty_host_cache() (and pinned memory's stats) read the device type's host
// allocator, and with none registered for PrivateUse1 it dereferenced a null pointer. Pinned
// memory is plain host memory here (the hooks' getPinnedMemoryAllocator): nothing is cached.
struct NeuronHostAllocator final : public at::HostAllocator {
  c10::DataPtr allocate(size_t n) override { return c10::GetCPUAllocator()->allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return c10::GetCPUAllocator()->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    c10::GetCPUAllocator()->copy_data(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return at::HostStats(); }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};
NeuronHostAllocator g_host_allocator;
struct HostRegistrar {
  HostRegistrar() { at::setHostAllocator(c10::DeviceType::PrivateUse1, &g_host_allocator); }
};
HostRegistrar host_registrar;

NeuronAllocator* install_allocator() {
  static NeuronAllocator allocator;
  auto* current = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  if (current != &allocator) allocator.base = current;
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &allocator, /*priority=*/255);
  return &allocator;
}
NeuronAllocator* g_allocator = install_allocator();
}  // namespace

extern "C" void neuron_set_memory_callbacks(MemoryStats stats, ResetPeak reset) {
  g_memory_stats = stats;
  g_reset_peak = reset;
}

extern "C" void neuron_set_sync_callback(SyncCallback cb) { g_sync = cb; }

extern "C" void neuron_set_stream_callback(StreamCallback cb) {
  g_python_thread = std::this_thread::get_id();
  g_stream_changed = cb;
}

// streams.py made `id` current on this thread itself: torch's view follows, with no callback
extern "C" void neuron_set_current_stream(int64_t id) { t_stream = id; }

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
  int64_t free_cut;   // wrapper frees outside every record since Python last took it (below)
  int64_t depth;      // FUNCTION records open on this thread (0: between ops)
  int64_t capture;    // the capture free_cut belongs to (g_capture when it was last added to)
  int64_t entry_at;   // CLOCK_REALTIME ns at the latest PythonSubclass record's start
  int64_t queued;     // run-queue delay from the watched record's end to entry_at (below)
  int64_t watch_delay;  // this thread's run-queue delay total when the watched record ended
  int64_t watch_cpu;    // its CPU time then (-1: unknown)
  int64_t watch_nvcsw;  // its voluntary context switches then (-1: unknown)
};
thread_local RoundTrip t_round_trip{0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1};
int64_t g_capture = 0;  // captures ended so far: a thread's frees after one are not the next's
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

// The simulating machine's preemptions and stalls (issue 27): time this thread was not running
// its own work though it had not blocked, which a host of its own would not lose. Two kinds:
// - run-queue delay: runnable but waiting for a CPU Linux gave another thread (4 torchrun ranks
//   on 2 cores). Linux keeps it per thread, in ns, as the second field of
//   /proc/thread-self/schedstat (one pread of a descriptor kept open per thread: ~0.5 us);
// - a stall of the virtual machine's CPU by its host (steal): Linux inside sees the thread
//   running and no run-queue delay. On this project's 2-core VM it is most of the time lost: 4
//   busy threads lost 0.9-1.0 s each in 1.3 s to stalls of up to 20 ms, against 0.1 s of
//   run-queue delay (docs/device.md). With paravirtual steal accounting the thread's CPU clock
//   (CLOCK_THREAD_CPUTIME_ID, ~0.2 us) leaves both out.
// Both are read at the two ends of the stretch the host clock keeps between two ops: when the
// watched record ends (the previous op's return is over; read before its clock, so the read is
// inside the return that is cut) and when torch's PythonSubclass record of the next op opens
// (inside that op's span, cut). Where the thread made no voluntary context switch between the
// two (getrusage's ru_nvcsw unchanged, ~0.1 us: it did not sleep, wait for I/O, a lock or
// another thread), the stretch's real host work is its CPU time, and `queued` is all the rest:
// the wall time less the CPU time. Where it did (a data loader's sleep, a read), the time
// blocked is the program's and stays: `queued` is the run-queue delay alone, and a stall of
// the VM's CPU in that stretch stays too. record.py cuts `queued`, at most the stretch itself.
// -1 where a figure cannot be read (not Linux, no /proc): nothing is cut.
struct SchedStat {
  int fd = -2;  // -2: not opened yet
  ~SchedStat() {
    if (fd >= 0) close(fd);
  }
};
thread_local SchedStat t_schedstat;

int64_t run_delay_ns() {
  int& fd = t_schedstat.fd;
  if (fd == -2) fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[96];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = 0;
  char* end = nullptr;
  std::strtoll(buf, &end, 10);  // the time spent on the CPU
  const char* second = end;
  const long long delay = std::strtoll(second, &end, 10);
  return end == second ? -1 : static_cast<int64_t>(delay);
}

inline int64_t thread_cpu_ns() {
  timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

inline int64_t voluntary_switches() {
  rusage r;
  return getrusage(RUSAGE_THREAD, &r) == 0 ? static_cast<int64_t>(r.ru_nvcsw) : -1;
}

// A reading at the end of a stretch: (delay, CPU time, voluntary switches, its time). Linux
// accounts a wait when the thread runs again, so a preemption at the read's own return to user
// space is missing from the delay read, and must lie after the reading's time too, or it would
// be cut twice (with the stretch and from the delay that follows). A read that took over kReadNs
// (~1 us unpreempted) was preempted: it is dated at its start. The switches are read first (one
// after that read lies in the stretch) and the CPU clock last, just before the reading's time.
constexpr int64_t kReadNs = 50000;
struct Reading {
  int64_t delay;
  int64_t cpu;
  int64_t nvcsw;
  int64_t at;
};

Reading read_at_end() {
  const int64_t nvcsw = voluntary_switches();
  const int64_t before = realtime_ns();
  const int64_t delay = run_delay_ns();
  const int64_t cpu = thread_cpu_ns();
  const int64_t after = realtime_ns();
  return {delay, cpu, nvcsw, after - before < kReadNs ? after : before};
}

// At the next op's entry: the time since the watched record ended that this thread was not
// running its own work (above), and the entry's time (after the reads: they lie in the cut span).
void read_at_entry(RoundTrip& rt) {
  const int64_t nvcsw = voluntary_switches();
  if (nvcsw >= 0 && nvcsw == rt.watch_nvcsw && rt.watch_cpu >= 0) {
    const int64_t cpu = thread_cpu_ns();
    rt.entry_at = realtime_ns();
    rt.queued = cpu >= 0 ? (rt.entry_at - rt.watch_end) - (cpu - rt.watch_cpu) : 0;
    return;
  }
  const int64_t delay = run_delay_ns();
  rt.queued = delay >= 0 && rt.watch_delay >= 0 ? delay - rt.watch_delay : 0;
  rt.entry_at = realtime_ns();
}

// The free of a wrapper (issue 14): a neuron tensor's Python object is a subclass instance
// holding a CPU payload, whose storage the runtime's memory accounting watches (memory.py), so
// its free costs several microseconds where a real device's tensor, a plain C++ tensor, costs
// the CPU's own free. Most frees happen between ops (autograd's engine dropping grads, the
// model's temporaries, zero_grad), outside every recorded span. While a capture records, each
// outermost free of a wrapper that starts with no FUNCTION record open on its thread is timed,
// and what it took beyond `g_free_ns` (the modeled free, spec.py) is added to this thread's
// `free_cut`; the runtime cuts it before the next op's span (record.py), as the previous op's
// return. Frees inside a record are inside a span or a round trip, cut already; frees inside
// a garbage collection are inside its pause (gcpause.py).
//
// Timed from the wrapper type's tp_finalize (CPython's subtype_dealloc calls it first, before
// the weak references, the instance dict with the payload, and the base's dealloc) to the end
// of torch's base type's tp_dealloc (subtype_dealloc calls it last), matched by the object's
// address. Neither slot is one CPython compares when a tensor's __class__ is assigned
// (torch.utils.swap_tensors in Module.to); the wrapper type's own tp_dealloc is: timing there
// made `Module.to("neuron")` fail with "object layout differs".
using Dealloc = void (*)(void*);
Dealloc g_base_dealloc = nullptr;  // torch's base tensor type's own tp_dealloc
int64_t g_free_ns = 0;
bool g_cut_frees = false;  // a capture records (the round-trip callback is on)
bool g_gc = false;         // a garbage collection runs (set by gcpause.py)
constexpr int64_t kStaleNs = 10000000;  // a free begun this long ago was not one (resurrected)
thread_local void* t_freeing = nullptr;  // the wrapper whose free is being timed
thread_local int64_t t_free_start = 0;
thread_local int64_t t_free_cpu = 0;  // the thread's CPU time when it began (-1: none)

std::unique_ptr<at::ObserverContext> on_record_start(const at::RecordFunction& fn) {
  // torch's own record around the call into a subclass's __torch_dispatch__ opens inside the
  // op's (after autograd and the boxing): the op's record is the one wanted
  RoundTrip& rt = t_round_trip;
  ++rt.depth;  // every record's end comes back through on_record_end
  if (rt.capture != g_capture) {  // this thread's first op since a capture ended
    rt.free_cut = 0;
    rt.capture = g_capture;
  }
  const char* name = fn.name();
  if (name[0] == 'P' && std::strcmp(name, "PythonSubclass") == 0) {
    read_at_entry(rt);  // the op is about to enter the runtime
    return nullptr;
  }
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
  if (rt.depth > 0) --rt.depth;  // a record opened before the callback was added has no start
  if (rt.watch == reinterpret_cast<int64_t>(&fn)) {
    const Reading r = read_at_end();  // the read is inside the return, cut with it
    rt.watch_delay = r.delay;
    rt.watch_cpu = r.cpu;
    rt.watch_nvcsw = r.nvcsw;
    rt.watch_end = r.at;
    rt.watch = 0;
  }
}
}  // namespace

// This thread's RoundTrip (valid for the thread's life).
extern "C" int64_t* neuron_round_trip_slot() { return &t_round_trip.start; }

// Stretches no op's record bounds (issue 27): the caller of loss.backward() runs its last op,
// then enters autograd's engine, whose first op runs on the device thread; once the graph is
// done it returns and runs its next op. handoff.py ends this thread's stretch where the caller
// enters the engine (the time it spent off its own work since its last op's return, as at an
// op's entry, and where that stretch began: 0 where no record's end starts one) and begins one
// where it returns (as a watched record's end does), so both are cut as between two ops.
extern "C" int64_t neuron_stretch_off(int64_t* since) {
  RoundTrip& rt = t_round_trip;
  *since = 0;
  if (rt.watch != 0 || rt.watch_end == 0) return 0;  // inside an op's record, or no stretch
  read_at_entry(rt);
  const int64_t off = rt.queued;
  rt.queued = 0;  // taken here: no op's entry takes it again
  *since = rt.watch_end;
  return off;
}

extern "C" void neuron_stretch_begins() {
  RoundTrip& rt = t_round_trip;
  if (rt.watch != 0) return;  // a record is watched: its end begins the stretch
  const Reading r = read_at_end();
  rt.watch_delay = r.delay;
  rt.watch_cpu = r.cpu;
  rt.watch_nvcsw = r.nvcsw;
  rt.watch_end = r.at;
}

// Turn this thread's callback on (at a capture's first recorded op: added anew, so it runs
// after the profiler's callbacks of this capture) or off (the capture is drained): registered,
// it makes every dispatcher call build a RecordFunction, which the unrecorded path must not pay.
extern "C" void neuron_round_trip(int on) {
  if (!on && g_cut_frees) ++g_capture;  // a capture ends: what threads summed since is stale
  g_cut_frees = on != 0;
  t_round_trip.depth = 0;
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

// The wrapper type's tp_finalize: a free begins (the GIL is held).
extern "C" void neuron_free_begins(void* obj) {
  if (!g_cut_frees || g_gc || t_round_trip.depth > 0) return;
  const int64_t now = realtime_ns();
  if (t_freeing != nullptr && now - t_free_start < kStaleNs) return;  // nested in another free
  t_freeing = obj;
  t_free_start = now;
  t_free_cpu = thread_cpu_ns();  // after the clock: the read is timed with the free, cut
}

// torch's base tensor type's tp_dealloc: every tensor's free ends here, a wrapper's too.
extern "C" void neuron_free_ends(void* obj) {
  g_base_dealloc(obj);
  if (obj != t_freeing) return;
  t_freeing = nullptr;
  // what the free took is its CPU time: a preemption or a stall of the VM's CPU inside it is
  // the stretch's, cut once with it (read_at_entry, record.py)
  const int64_t cpu = t_free_cpu >= 0 ? thread_cpu_ns() : -1;
  const int64_t took = cpu >= 0 ? cpu - t_free_cpu : realtime_ns() - t_free_start;
  const int64_t spent = took - g_free_ns;
  if (spent <= 0) return;
  RoundTrip& rt = t_round_trip;
  if (rt.capture != g_capture) {
    rt.free_cut = 0;
    rt.capture = g_capture;
  }
  rt.free_cut += spent;
}

// Time the frees of a wrapper type: `finalize` is the address of its tp_finalize slot (empty),
// `base_dealloc` that of torch's base tensor type's tp_dealloc slot (guard.py checked both).
extern "C" void neuron_watch_frees(void* finalize, void* base_dealloc) {
  void** fin = static_cast<void**>(finalize);
  void** base = static_cast<void**>(base_dealloc);
  if (*base == reinterpret_cast<void*>(&neuron_free_ends)) return;
  g_base_dealloc = reinterpret_cast<Dealloc>(*base);
  *base = reinterpret_cast<void*>(&neuron_free_ends);
  *fin = reinterpret_cast<void*>(&neuron_free_begins);
}

// The modeled host cost of one free (spec.py's free_ns), set when a capture starts.
extern "C" void neuron_free_cost(int64_t ns) { g_free_ns = ns; }

// A garbage collection starts (1) or ends (0): frees inside it are inside its own pause.
extern "C" void neuron_gc(int running) { g_gc = running != 0; }

// torch asks a Python subclass for `__torch_function__` (every torch call and property read with
// a wrapper argument) and `__torch_dispatch__` (every op it dispatches into Python, twice) by
// name: PyObject_FastGetAttrString makes an interned string from the C name and runs the
// generic attribute lookup, which binds the classmethod anew each time (~0.6-0.8k
// instructions a lookup; issue 14: outside the runtime's spans these stay on the host clock,
// issue 16: inside they are the op path's). It calls the type's tp_getattr, the C-string slot,
// when there is one, as CPython's PyObject_GetAttrString does; CPython's own attribute access
// uses tp_getattro, and __class__ assignment compares neither. So the wrapper type's tp_getattr
// (guard.py puts ours there) answers those two names for an instance of exactly that type with
// the objects the generic lookup finds (the class's disabled __torch_function__, its
// __torch_dispatch__ bound to it: guard.py hands them over and keeps them), and any other name,
// or any other type, through the type's own tp_getattro, as CPython would.
namespace {
using GetAttro = void* (*)(void*, void*);
using Intern = void* (*)(const char*);
using DecRef = void (*)(void*);
void* g_attr_type = nullptr;      // the wrapper type
void* g_torch_function = nullptr;  // what its __torch_function__ is
void* g_torch_dispatch = nullptr;  // its __torch_dispatch__, bound to it
Intern g_intern = nullptr;         // PyUnicode_InternFromString
DecRef g_decref = nullptr;         // Py_DecRef
constexpr int kGetAttroWord = 18;  // tp_getattro's place in a type object (guard.py checks it)

inline void* new_ref(void* o) {
  ++*static_cast<intptr_t*>(o);  // Py_INCREF of an object that is not immortal
  return o;
}
}  // namespace

extern "C" void* neuron_getattr(void* obj, char* name) {
  void* type = *(static_cast<void**>(obj) + 1);  // Py_TYPE
  if (type == g_attr_type && name[0] == '_' && name[1] == '_' && name[2] == 't') {
    if (std::strcmp(name, "__torch_function__") == 0) return new_ref(g_torch_function);
    if (std::strcmp(name, "__torch_dispatch__") == 0) return new_ref(g_torch_dispatch);
  }
  void* key = g_intern(name);
  if (key == nullptr) return nullptr;
  auto getattro = *reinterpret_cast<GetAttro*>(static_cast<void**>(type) + kGetAttroWord);
  void* found = getattro(obj, key);
  g_decref(key);
  return found;
}

// Answer the two names for `type` (its tp_getattr slot is at `slot`, empty; guard.py checked).
extern "C" void neuron_fast_attrs(void* type, void* slot, void* torch_function,
                                  void* torch_dispatch, void* intern, void* decref) {
  g_attr_type = type;
  g_torch_function = torch_function;
  g_torch_dispatch = torch_dispatch;
  g_intern = reinterpret_cast<Intern>(intern);
  g_decref = reinterpret_cast<DecRef>(decref);
  *static_cast<void**>(slot) = reinterpret_cast<void*>(&neuron_getattr);
}
