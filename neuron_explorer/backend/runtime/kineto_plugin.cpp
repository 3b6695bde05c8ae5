// The neuron device's Kineto plugin (torch's REGISTER_PRIVATEUSE1_PROFILER): while
// ProfilerActivity.PrivateUse1 is profiled, the runtime's device work becomes Kineto activities
// on the device's lanes, linked to the CPU op that launched it, so torch.profiler's own output
// (key_averages, export_chrome_trace, tensorboard_trace_handler) shows the device.
// Built by kineto_plugin.py with g++ against the installed torch headers and cached.
//
// The runtime's records live in Python (runtime/events.py), so when Kineto first asks the
// session for its metadata or its activities, the session asks Python (a ctypes callback, which
// calls neuron_kineto_add once for each activity and neuron_kineto_metadata for the runtime's
// events, which travel in the trace for `neuron-explorer import`).
// Correlation: Kineto pushes each CPU op's correlation id on the op's thread while it runs; the
// session logs those pushes and pops with their time, and a runtime call is linked to the
// innermost op open on its thread at the call's end (its payload's nested ops have returned).
#define USE_KINETO 1
#define FMT_HEADER_ONLY 1  // fmt::format in GenericTraceActivity::addMetadata: torch exports no fmt
#include <libkineto.h>
#include <output_base.h>
#include <sys/syscall.h>
#include <time.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {
using libkineto::ActivityType;

constexpr int64_t kDevicePid = 0;  // the device's "process" in the trace: its index, as a GPU's
constexpr int64_t kDeviceSort = 1000;  // below the host's threads in a trace viewer

// One push (id > 0) or pop (id == 0) of a CPU op's correlation id on a thread.
struct Mark {
  int32_t tid;
  uint64_t id;
  int64_t t_ns;
};

// One activity handed over by Python, before it is linked.
struct Pending {
  int type;
  std::string name;
  int64_t device;  // -1: the calling host thread's lane in the process (a runtime call)
  int32_t resource;
  int64_t start_ns;
  int64_t end_ns;
  uint32_t flow;  // the runtime's flow id: a launch and the device work it caused
  int flow_start;
  int32_t tid;     // host thread of the runtime call (the device work's launch)
  int64_t at_ns;   // when that call was inside its op (0: not linked)
  std::string meta;  // "key=raw json" lines
};

using Collect = void (*)(int64_t start_ns, int64_t end_ns);
Collect g_collect = nullptr;
std::mutex g_mutex;
std::vector<Mark> g_marks;  // this session's pushes and pops, in order per thread
bool g_recording = false;
std::vector<Pending> g_pending;
std::map<int32_t, std::string> g_lanes;  // resource id -> lane name, on the device
std::unordered_map<std::string, std::string> g_metadata;  // the trace's top-level keys, raw JSON

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);  // torch.profiler's own clock (time.time_ns)
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline int32_t thread_id() {
  thread_local int32_t tid = static_cast<int32_t>(syscall(SYS_gettid));  // threading.get_native_id
  return tid;
}

// The op each runtime call ran under: the innermost op open on its thread at the call's time,
// passing over the span of the device tensor's own __torch_dispatch__ (torch's
// "PythonSubclass"), which sits between an aten op and the runtime. One sweep of each thread's
// marks, in time order, against its calls sorted by time.
std::vector<const libkineto::ITraceActivity*> launching_ops(
    const libkineto::getLinkedActivityCallback& linked) {
  std::vector<const libkineto::ITraceActivity*> out(g_pending.size(), nullptr);
  std::unordered_map<int32_t, std::vector<const Mark*>> marks;
  for (const Mark& m : g_marks) marks[m.tid].push_back(&m);
  std::unordered_map<int32_t, std::vector<size_t>> calls;
  for (size_t i = 0; i < g_pending.size(); ++i) {
    if (g_pending[i].at_ns) calls[g_pending[i].tid].push_back(i);
  }
  std::unordered_map<uint64_t, const libkineto::ITraceActivity*> cache;
  auto op_of = [&](uint64_t id) {
    auto it = cache.find(id);
    if (it != cache.end()) return it->second;
    return cache[id] = linked(static_cast<int32_t>(id));
  };
  for (auto& [tid, idx] : calls) {
    std::sort(idx.begin(), idx.end(),
              [](size_t a, size_t b) { return g_pending[a].at_ns < g_pending[b].at_ns; });
    const auto& ms = marks[tid];
    std::vector<uint64_t> open;
    size_t j = 0;
    for (size_t i : idx) {
      for (; j < ms.size() && ms[j]->t_ns <= g_pending[i].at_ns; ++j) {
        if (ms[j]->id) {
          open.push_back(ms[j]->id);
        } else if (!open.empty()) {
          open.pop_back();
        }
      }
      const libkineto::ITraceActivity* fallback = nullptr;
      for (auto it = open.rbegin(); it != open.rend(); ++it) {
        const libkineto::ITraceActivity* op = op_of(*it);
        if (op == nullptr) continue;
        if (op->name() != "PythonSubclass") {
          out[i] = op;
          break;
        }
        if (fallback == nullptr) fallback = op;
      }
      if (out[i] == nullptr) out[i] = fallback;
    }
  }
  return out;
}

void add_meta(libkineto::GenericTraceActivity& act, const std::string& meta) {
  size_t pos = 0;
  while (pos < meta.size()) {
    size_t nl = meta.find('\n', pos);
    if (nl == std::string::npos) nl = meta.size();
    size_t eq = meta.find('=', pos);
    if (eq != std::string::npos && eq < nl) {
      act.addMetadata(meta.substr(pos, eq - pos), meta.substr(eq + 1, nl - eq - 1));
    }
    pos = nl + 1;
  }
}

class NeuronSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_marks.clear();
    g_recording = true;
    start_ns_ = now_ns();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_recording = false;
    stop_ns_ = now_ns();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  // Kineto reads the metadata first, then the activities: the first of the two asks Python.
  std::unordered_map<std::string, std::string> getMetadata() override {
    collect();
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_metadata;
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override {}
  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked, int64_t start_ns,
                    int64_t end_ns) override {
    collect();
    std::lock_guard<std::mutex> lock(g_mutex);
    auto ops = launching_ops(linked);
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns, end_ns, "neuron");
    buffer_->gpuOpCount = -1;
    int32_t pid = static_cast<int32_t>(getpid());
    for (size_t i = 0; i < g_pending.size(); ++i) {
      const Pending& p = g_pending[i];
      buffer_->emplace_activity(buffer_->span, static_cast<ActivityType>(p.type), p.name);
      auto& act = *buffer_->activities.back();
      act.startTime = p.start_ns;
      act.endTime = p.end_ns;
      act.device = p.device < 0 ? pid : static_cast<int32_t>(kDevicePid + p.device);
      act.resource = p.device < 0 ? p.tid : p.resource;
      act.threadId = p.tid;
      // torch.profiler gives an unlinked CPU-side event the device time of the op whose
      // correlation id equals its own: a runtime call keeps none (its flow is in its args)
      act.id = p.device < 0 ? 0 : static_cast<int32_t>(p.flow);
      if (p.flow) {
        act.flow.id = p.flow;
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        act.flow.start = p.flow_start ? 1 : 0;
      }
      act.linked = ops[i];
      add_meta(act, p.meta);
      logger.handleActivity(act);
    }
    g_pending.clear();
    g_marks.clear();
    g_marks.shrink_to_fit();  // a long session's marks: free them now, not at the next start
    status_ = libkineto::TraceStatus::READY;
  }
  void collect() {
    if (collected_) return;
    collected_ = true;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_pending.clear();
      g_metadata.clear();
    }
    // Python calls neuron_kineto_add for each activity and neuron_kineto_metadata
    if (g_collect) g_collect(start_ns_, stop_ns_ ? stop_ns_ : now_ns());
  }
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{kDevicePid, kDeviceSort, "neuron", "neuron 0"});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [id, name] : g_lanes) out.push_back({id, id, kDevicePid, name});
    return out;
  }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }
  void pushCorrelationId(uint64_t id) override {
    int64_t t = now_ns();
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_recording) g_marks.push_back({thread_id(), id, t});
  }
  void popCorrelationId() override {
    int64_t t = now_ns();
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_recording) g_marks.push_back({thread_id(), 0, t});
  }

 private:
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  int64_t start_ns_ = 0, stop_ns_ = 0;  // this session's recording window
  bool collected_ = false;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return types_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& requested, const libkineto::Config& config) override {
    // torch asks for these only with ProfilerActivity.PrivateUse1 (kineto_shim's list)
    if (!requested.count(ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<NeuronSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t ts_ms, int64_t duration_ms, const std::set<ActivityType>& requested,
      const libkineto::Config& config) override {
    return configure(requested, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<ActivityType> types_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);
}  // namespace

extern "C" void neuron_kineto_set_collect(Collect cb) { g_collect = cb; }

extern "C" void neuron_kineto_lane(int32_t id, const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_lanes[id] = name;
}

// One activity; called by the collect callback (under no lock of ours).
extern "C" void neuron_kineto_add(int type, const char* name, int64_t device, int32_t resource,
                                  int64_t start_ns, int64_t end_ns, uint32_t flow,
                                  int flow_start, int32_t tid, int64_t at_ns, const char* meta) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pending.push_back({type, name, device, resource, start_ns, end_ns, flow, flow_start, tid,
                       at_ns, meta});
}

// One top-level key of the trace (`value` raw JSON, without backslashes or newlines: Kineto
// turns those into '/' and drops them).
extern "C" void neuron_kineto_metadata(const char* key, const char* value) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_metadata[key] = value;
}

extern "C" int neuron_kineto_registered() {
  return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory() ? 1 : 0;
}

// A device allocation (bytes > 0) or free (bytes < 0) for torch.profiler's memory profile
// (profile_memory=True), as a CUDA allocator reports its own: the storage's key stands for its
// address. A no-op unless this thread's profiler profiles memory.
extern "C" void neuron_kineto_memory(int64_t key, int64_t bytes, int64_t allocated,
                                     int64_t reserved) {
  c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(key), bytes,
                                   static_cast<size_t>(allocated), static_cast<size_t>(reserved),
                                   c10::Device(c10::DeviceType::PrivateUse1, 0));
}
