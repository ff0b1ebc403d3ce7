// The hierarchical all-reduce's inner groups (src/comm/hierarchy): NVLink islands from
// `nvidia-smi topo -m` matrices of real machine shapes, NUMA nodes, blocks, and the rule that
// keeps the nodes as groups unless a split gives equal groups, several per node.
#include <gtest/gtest.h>

#include <gpucloud/runtime/error.hpp>

#include "comm/hierarchy.hpp"

#include <cstdlib>
#include <string>
#include <vector>

namespace {

using gpucloud::GpuPlacement;
using gpucloud::NumaNode;
using gpucloud::Topology;
using namespace gpucloud::detail;  // NOLINT(google-build-using-namespace): the unit under test
using Links = std::vector<std::vector<std::string>>;

// n GPUs, every pair joined by @p between unless @p nv says otherwise.
Links matrix(int n, const std::string& between, const std::vector<std::pair<int, int>>& nv = {}) {
  Links m(static_cast<std::size_t>(n), std::vector<std::string>(static_cast<std::size_t>(n), between));
  for (int i = 0; i < n; ++i) m[static_cast<std::size_t>(i)][static_cast<std::size_t>(i)] = "X";
  for (auto [a, b] : nv) {
    m[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] = "NV4";
    m[static_cast<std::size_t>(b)][static_cast<std::size_t>(a)] = "NV4";
  }
  return m;
}

TEST(NvlinkIsland, BridgedPairsOnAPcieServerAreTwoIslands) {
  const Links m = matrix(4, "SYS", {{0, 1}, {2, 3}});
  EXPECT_EQ(nvlink_island(m, 0), 0);
  EXPECT_EQ(nvlink_island(m, 1), 0);
  EXPECT_EQ(nvlink_island(m, 2), 2);
  EXPECT_EQ(nvlink_island(m, 3), 2);
}

TEST(NvlinkIsland, AnNvswitchNodeIsOneIslandAndPcieOnlyIsNone) {
  const Links all = matrix(8, "NV18");
  for (int g = 0; g < 8; ++g) EXPECT_EQ(nvlink_island(all, g), 0);
  const Links pcie = matrix(4, "PHB");
  for (int g = 0; g < 4; ++g) EXPECT_EQ(nvlink_island(pcie, g), -1);
  EXPECT_EQ(nvlink_island({}, 0), -1) << "no matrix (no NVML)";
  EXPECT_EQ(nvlink_island(pcie, 7), -1) << "a GPU the matrix does not cover";
}

TEST(NvlinkIsland, LinksJoinTransitivelyAndOneSidedRowsCount) {
  Links chain = matrix(4, "NODE", {{1, 2}, {2, 3}});
  EXPECT_EQ(nvlink_island(chain, 3), 1);
  EXPECT_EQ(nvlink_island(chain, 0), -1);
  chain[0][3] = "NV1";  // a row that says it while the other does not
  EXPECT_EQ(nvlink_island(chain, 2), 0);
}

Topology two_numa_nodes() {
  Topology t;
  t.numa_nodes = {NumaNode{0, {0, 1, 2, 3}, 1 << 30}, NumaNode{1, {4, 5, 6, 7}, 1 << 30}};
  t.allowed_cpus = {4, 5};
  t.gpus = {GpuPlacement{0, "0000:17:00.0", 0, {0, 1, 2, 3}}, GpuPlacement{1, "0000:65:00.0", 0, {0, 1, 2, 3}},
            GpuPlacement{2, "0000:ca:00.0", 1, {4, 5, 6, 7}}, GpuPlacement{3, "0000:e3:00.0", 1, {4, 5, 6, 7}}};
  t.gpu_links = matrix(4, "SYS", {{0, 1}, {2, 3}});
  return t;
}

TEST(NumaNodeOf, TheNodeHoldingEveryCpuOrNone) {
  const Topology t = two_numa_nodes();
  EXPECT_EQ(numa_node_of(t, {1, 2}), 0);
  EXPECT_EQ(numa_node_of(t, {7}), 1);
  EXPECT_EQ(numa_node_of(t, {3, 4}), -1) << "spans both";
  EXPECT_EQ(numa_node_of(t, {}), -1);
  EXPECT_EQ(numa_node_of(t, {99}), -1);
}

TEST(SubgroupKey, EachRequestReadsItsPartOfTheMachine) {
  const Topology t = two_numa_nodes();
  using Kind = HierarchyRequest::Kind;
  EXPECT_EQ(subgroup_key({Kind::node, 0}, 2, 5, t), -1);
  EXPECT_EQ(subgroup_key({Kind::blocks, 2}, -1, 5, t), 2);
  EXPECT_EQ(subgroup_key({Kind::numa, 0}, -1, 0, t), 1) << "the allowed CPUs' node";
  EXPECT_EQ(subgroup_key({Kind::numa, 0}, 0, 0, t), 0) << "the GPU's node";
  for (Kind k : {Kind::nvlink, Kind::automatic}) {
    const long long a = subgroup_key({k, 0}, 0, 0, t), b = subgroup_key({k, 0}, 1, 1, t);
    const long long c = subgroup_key({k, 0}, 2, 2, t), d = subgroup_key({k, 0}, 3, 3, t);
    EXPECT_GE(a, 0);
    EXPECT_EQ(a, b);
    EXPECT_EQ(c, d);
    EXPECT_NE(a, c);
    EXPECT_EQ(subgroup_key({k, 0}, -1, 0, t), -1) << "a host communicator has no island";
  }
  Topology pcie = t;
  pcie.gpu_links = matrix(4, "PHB");
  EXPECT_EQ(subgroup_key({Kind::automatic, 0}, 0, 0, pcie), -1);
}

// Ranks on @p nodes nodes of @p per ranks, in blocks, with @p key(local rank) as subgroup.
template <class Key>
std::optional<NodeLayout> layout_of(int nodes, int per, int rank, Key key) {
  std::vector<int> node_of;
  std::vector<long long> keys;
  for (int r = 0; r < nodes * per; ++r) {
    node_of.push_back(r / per);
    keys.push_back(key(r % per));
  }
  return group_layout(node_of, keys, rank);
}

TEST(GroupLayout, EqualGroupsSeveralPerNodeSplitTheNodes) {
  // 2 nodes of 4 ranks, 2 islands each: 4 groups of 2; rank 5 is node 1's first island's second.
  const auto g = layout_of(2, 4, 5, [](int l) { return l / 2; });
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->nodes, 4);
  EXPECT_EQ(g->local_size, 2);
  EXPECT_EQ(g->node, 2);
  EXPECT_EQ(g->local_rank, 1);
  // The same island key on two nodes is two groups.
  const auto same = layout_of(2, 2, 3, [](int) { return 7; });
  EXPECT_FALSE(same.has_value()) << "one group per node: the nodes are the groups";
}

TEST(GroupLayout, RanksInRoundRobinOrderStillGroupByKey) {
  // One node, 4 ranks, islands {0, 2} and {1, 3}.
  const std::vector<int> node_of{0, 0, 0, 0};
  const std::vector<long long> keys{10, 20, 10, 20};
  const auto g = group_layout(node_of, keys, 2);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->node, 0);
  EXPECT_EQ(g->local_rank, 1);
  EXPECT_EQ(group_layout(node_of, keys, 3)->node, 1);
}

TEST(GroupLayout, TheNodesStayTheGroupsWhenASplitWouldNotBeEven) {
  EXPECT_FALSE(layout_of(1, 4, 0, [](int l) { return l == 3 ? 1 : 0; })) << "3 + 1";
  EXPECT_FALSE(layout_of(1, 4, 0, [](int l) { return l; })) << "groups of one";
  EXPECT_FALSE(layout_of(1, 4, 0, [](int l) { return l == 2 ? -1 : 0; })) << "a rank that does not know";
  EXPECT_FALSE(group_layout({}, {}, 0));
}

TEST(HierarchyEnvironment, ReadsTheLevelsAndNamesTheVariableForAnythingElse) {
  using Kind = HierarchyRequest::Kind;
  const char* before = std::getenv("GPUCLOUD_HIERARCHY");
  const std::string saved = before != nullptr ? before : "";
  struct Case {
    const char* text;
    Kind kind;
    int block;
  };
  for (const Case& c : {Case{"", Kind::automatic, 0}, Case{"auto", Kind::automatic, 0}, Case{"node", Kind::node, 0},
                        Case{"numa", Kind::numa, 0}, Case{"nvlink", Kind::nvlink, 0}, Case{"4", Kind::blocks, 4}}) {
    ::setenv("GPUCLOUD_HIERARCHY", c.text, 1);
    const HierarchyRequest r = hierarchy_from_environment("test");
    EXPECT_EQ(r.kind, c.kind) << c.text;
    EXPECT_EQ(r.block, c.block) << c.text;
  }
  for (const char* bad : {"0", "-2", "two", "4x", "NUMA"}) {
    ::setenv("GPUCLOUD_HIERARCHY", bad, 1);
    try {
      (void)hierarchy_from_environment("Communicator::mpi_world");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const gpucloud::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("GPUCLOUD_HIERARCHY: '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
  if (before != nullptr) {
    ::setenv("GPUCLOUD_HIERARCHY", saved.c_str(), 1);
  } else {
    ::unsetenv("GPUCLOUD_HIERARCHY");
  }
  EXPECT_THROW(check_blocks({Kind::blocks, 3}, 4, true, "test"), gpucloud::InvalidArgument);
  EXPECT_NO_THROW(check_blocks({Kind::blocks, 2}, 4, true, "test"));
  EXPECT_NO_THROW(check_blocks({Kind::blocks, 3}, 4, false, "test")) << "uneven nodes: the nodes stay the groups";
  EXPECT_EQ(hierarchy_level({Kind::blocks, 2}, true), "blocks of 2");
  EXPECT_EQ(hierarchy_level({Kind::automatic, 0}, true), "nvlink");
  EXPECT_EQ(hierarchy_level({Kind::numa, 0}, false), "node");
}

}  // namespace
