// The machine's topology (hwloc, or sysfs without it) against Linux's own description read here,
// and binding advice on this machine and on made-up ones: two NUMA nodes, GPUs on each, a
// restricted affinity.
#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/monitor/topology.hpp>
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace gc = gpucloud;

namespace {

std::vector<int> cpu_list(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  std::vector<int> out;
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ',')) {
    const auto dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int c = first; c <= last; ++c) out.push_back(c);
  }
  return out;
}

TEST(Topology, AgreesWithTheKernelsOwnDescription) {
  const gc::Topology t = gc::topology();
  EXPECT_FALSE(t.source.empty());
  const std::vector<int> online = cpu_list("/sys/devices/system/cpu/online");
  EXPECT_EQ(t.hardware_threads, static_cast<int>(online.size()));
  EXPECT_GE(t.cores, 1);
  EXPECT_LE(t.cores, t.hardware_threads);
  EXPECT_GE(t.packages, 1);
  EXPECT_LE(t.packages, t.cores);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  EXPECT_EQ(static_cast<int>(t.allowed_cpus.size()), CPU_COUNT(&mask));
  for (int c : t.allowed_cpus) EXPECT_TRUE(CPU_ISSET(c, &mask)) << c;
  ASSERT_FALSE(t.numa_nodes.empty());
  std::set<int> covered;
  for (const gc::NumaNode& n : t.numa_nodes) {
    const std::string sys = "/sys/devices/system/node/node" + std::to_string(n.index) + "/cpulist";
    if (std::filesystem::exists(sys)) {
      EXPECT_EQ(n.cpus, cpu_list(sys)) << n.index;
    }
    EXPECT_GT(n.memory_bytes, 0u) << n.index;
    covered.insert(n.cpus.begin(), n.cpus.end());
  }
  EXPECT_EQ(std::vector<int>(covered.begin(), covered.end()), online);
}

gc::Topology two_nodes() {  // 2 NUMA nodes of 4 CPUs, all allowed
  gc::Topology t;
  t.packages = 2;
  t.cores = t.hardware_threads = 8;
  t.allowed_cpus = {0, 1, 2, 3, 4, 5, 6, 7};
  t.numa_nodes = {{0, {0, 1, 2, 3}, 1 << 30}, {1, {4, 5, 6, 7}, 1 << 30}};
  return t;
}

// MIG instances (NVML): none without NVML (and the reason says why) or without a GPU in MIG
// mode; each one named by a MIG UUID, with SMs and memory, its parent GPU's UUID, and selectable
// by that UUID when it is visible to this process. Runs in scripts/gpu-check.sh.
TEST(Topology, MigInstancesAreListedWithTheirUuids) {
  const std::vector<gc::MigInstance> all = gc::mig_instances();
  if (!gc::nvml_unavailable_reason().empty()) {
    EXPECT_TRUE(all.empty());
    GTEST_SKIP() << "no NVML: " << gc::nvml_unavailable_reason();
  }
  std::printf("%zu MIG instance(s)\n", all.size());
  for (const gc::MigInstance& m : all) {
    EXPECT_EQ(m.uuid.rfind("MIG-", 0), 0u) << m.uuid;
    EXPECT_EQ(m.gpu_uuid.rfind("GPU-", 0), 0u) << m.gpu_uuid;
    EXPECT_GT(m.multiprocessors, 0) << m.uuid;
    EXPECT_GT(m.memory_bytes, 0u) << m.uuid;
    EXPECT_GE(m.gpu_instance_id, 0);
    EXPECT_GE(m.compute_instance_id, 0);
    std::printf("  %s on GPU %d: %d SMs, %zu MiB\n", m.uuid.c_str(), m.gpu, m.multiprocessors, m.memory_bytes >> 20);
    try {
      const gc::Device d = gc::Device::parse(m.uuid);
      EXPECT_TRUE(d.is_cuda()) << m.uuid;
    } catch (const gc::InvalidArgument& e) {  // not visible to this process: named as such
      EXPECT_NE(std::string(e.what()).find(m.uuid), std::string::npos) << e.what();
    }
  }
}

TEST(BindingAdvice, RanksShareTheAllowedCpusDisjointlyWithinNumaNodes) {
  const gc::Topology t = two_nodes();
  EXPECT_EQ(gc::binding_advice(t, 0, 2).cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(gc::binding_advice(t, 1, 2).cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(gc::binding_advice(t, 1, 2).numa_node, 1);
  EXPECT_EQ(gc::binding_advice(t, 1, 4).cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(gc::binding_advice(t, 2, 4).cpus, (std::vector<int>{4, 5}));
  EXPECT_EQ(gc::binding_advice(t, 0, 1).cpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (int size = 1; size <= 8; ++size) {  // disjoint, covering, never across a node
    std::set<int> seen;
    for (int r = 0; r < size; ++r) {
      const gc::BindingAdvice a = gc::binding_advice(t, r, size);
      ASSERT_FALSE(a.cpus.empty()) << r << "/" << size;
      for (int c : a.cpus) EXPECT_TRUE(seen.insert(c).second) << c << " twice, " << size << " ranks";
      if (size >= 2) {
        EXPECT_TRUE(std::all_of(a.cpus.begin(), a.cpus.end(), [&](int c) { return c / 4 == a.numa_node; })) << a.reason;
      }
    }
    EXPECT_EQ(seen.size(), 8u) << size;
  }
  // More ranks than CPUs: one CPU each, shared round the allowed ones.
  EXPECT_EQ(gc::binding_advice(t, 9, 10).cpus.size(), 1u);
}

TEST(BindingAdvice, ARestrictedAffinityIsRespected) {
  gc::Topology t = two_nodes();
  t.allowed_cpus = {2, 3, 6};  // taskset -c 2,3,6
  EXPECT_EQ(gc::binding_advice(t, 0, 2).cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(gc::binding_advice(t, 1, 2).cpus, (std::vector<int>{6}));
  EXPECT_EQ(gc::binding_advice(t, 0, 1).cpus, (std::vector<int>{2, 3, 6}));
}

TEST(BindingAdvice, RanksFollowTheirGpusNumaNode) {
  gc::Topology t = two_nodes();
  t.gpus = {{0, "0000:17:00.0", 0, {0, 1, 2, 3}}, {1, "0000:b3:00.0", 1, {4, 5, 6, 7}}};
  // 4 local ranks, GPU r % 2: ranks 0 and 2 on GPU 0 (node 0), 1 and 3 on GPU 1 (node 1).
  EXPECT_EQ(gc::binding_advice(t, 0, 4, 0).cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(gc::binding_advice(t, 2, 4, 0).cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(gc::binding_advice(t, 1, 4, 1).cpus, (std::vector<int>{4, 5}));
  const gc::BindingAdvice a = gc::binding_advice(t, 3, 4, 1);
  EXPECT_EQ(a.cpus, (std::vector<int>{6, 7}));
  EXPECT_EQ(a.numa_node, 1);
  EXPECT_NE(a.reason.find("cuda:1 is on NUMA node 1; 2 local rank(s) share its 4 allowed CPUs (4-7)"),
            std::string::npos)
      << a.reason;
  t.gpus[1].numa_node = -1;  // a platform that does not say: the host's rule
  EXPECT_EQ(gc::binding_advice(t, 1, 2, 1).cpus, (std::vector<int>{4, 5, 6, 7}));
}

TEST(BindingAdvice, BadArgumentsAreNamed) {
  const gc::Topology t = two_nodes();
  auto message = [&](int rank, int size, int gpu) {
    try {
      gc::binding_advice(t, rank, size, gpu);
    } catch (const gc::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(2, 2, -1).find("local_rank: 2 is not in [0, 2)"), std::string::npos);
  EXPECT_NE(message(0, 0, -1).find("local_size: 0 is not positive"), std::string::npos);
  EXPECT_NE(message(0, 1, 0).find("gpu: 0 is not -1 (the host) or one of the 0 GPUs"), std::string::npos);
}

TEST(BindingAdvice, OnThisMachineEveryRankGetsAllowedCpus) {
  const gc::Topology t = gc::topology();
  const std::set<int> allowed(t.allowed_cpus.begin(), t.allowed_cpus.end());
  for (int size = 1; size <= 4; ++size) {
    for (int r = 0; r < size; ++r) {
      const gc::BindingAdvice a = gc::binding_advice(t, r, size);
      ASSERT_FALSE(a.cpus.empty());
      for (int c : a.cpus) EXPECT_EQ(allowed.count(c), 1u) << c;
    }
  }
}

}  // namespace
